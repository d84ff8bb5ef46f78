/* Names of the operation kinds and of the ops-table dimensions, and the inverse of
 * _al_row_index: the report walks rows by index and needs their coordinates back. */
#include "profiler.h"

static const char *const op_names[AL_OP_COUNT] = {
    [AL_OP_MALLOC] = "malloc",
    [AL_OP_CALLOC] = "calloc",
    [AL_OP_REALLOC] = "realloc",
    [AL_OP_FREE] = "free",
    [AL_OP_POSIX_MEMALIGN] = "posix_memalign",
    [AL_OP_ALIGNED_ALLOC] = "aligned_alloc",
    [AL_OP_MEMALIGN] = "memalign",
    [AL_OP_VALLOC] = "valloc",
    [AL_OP_PVALLOC] = "pvalloc",
    [AL_OP_NEW] = "new",
    [AL_OP_DELETE] = "delete",
};

static const char *const reuse_names[AL_REUSE_COUNT] = { "new", "reused", "n/a" };
static const char *const phase_names[AL_PHASE_COUNT] = { "serial", "parallel" };

const char *_al_op_name(unsigned op) { return op < AL_OP_COUNT ? op_names[op] : "?"; }
const char *_al_reuse_name(unsigned reuse) { return reuse < AL_REUSE_COUNT ? reuse_names[reuse] : "?"; }
const char *_al_phase_name(unsigned phase) { return phase < AL_PHASE_COUNT ? phase_names[phase] : "?"; }

void _al_row_split(unsigned row, unsigned *op, unsigned *large, unsigned *reuse, unsigned *phase)
{
    *phase = row % AL_PHASE_COUNT;
    row /= AL_PHASE_COUNT;
    *reuse = row % AL_REUSE_COUNT;
    row /= AL_REUSE_COUNT;
    *large = row % 2;
    *op = row / 2;
}
