/* Event names to perf_event_attr encodings: libpfm4, which knows the CPU's own PMU events and
 * the generic perf names (cycles, cache-misses, page-faults, ...), and the encodings that
 * 'alloclens run' resolves ahead for the processes it profiles. Shared by the profiler and
 * the CLI. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The kernel's header first: libpfm4's own copy of its definitions then stands aside. */
#include "counters.h"
#include "profiler.h"

#include <perfmon/pfmlib_perf_event.h>

const char _al_events_default_hw[] = "instructions,cache-misses,dTLB-load-misses,page-faults";
const char _al_events_default_sw[] = "page-faults,context-switches,task-clock";

/* ---- libpfm4 --------------------------------------------------------------------------- */

/* libpfm4 is opened for the names and closed once they are resolved: loading it relocates its
 * event tables, about 2 MiB that would stay resident in the profiled process all run long. */
#define PFM_SONAME "libpfm.so.4"

static struct {
    void *handle;
    int init_ret;
    char why[160]; /* why it could not be loaded */
    __typeof__(pfm_initialize) *initialize;
    __typeof__(pfm_terminate) *terminate;
    __typeof__(pfm_get_os_event_encoding) *encode;
    __typeof__(pfm_strerror) *strerror;
} pfm = { .init_ret = PFM_ERR_NOINIT };

static bool pfm_open(void)
{
    if (pfm.handle)
        return pfm.init_ret == PFM_SUCCESS;
    pfm.handle = dlopen(PFM_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!pfm.handle) {
        const char *e = dlerror();
        snprintf(pfm.why, sizeof pfm.why, "libpfm4 cannot be loaded: %s", e ? e : PFM_SONAME);
        return false;
    }
    pfm.initialize = (__typeof__(pfm.initialize))dlsym(pfm.handle, "pfm_initialize");
    pfm.terminate = (__typeof__(pfm.terminate))dlsym(pfm.handle, "pfm_terminate");
    pfm.encode = (__typeof__(pfm.encode))dlsym(pfm.handle, "pfm_get_os_event_encoding");
    pfm.strerror = (__typeof__(pfm.strerror))dlsym(pfm.handle, "pfm_strerror");
    if (!pfm.initialize || !pfm.terminate || !pfm.encode || !pfm.strerror) {
        snprintf(pfm.why, sizeof pfm.why, "%s lacks the libpfm4 functions needed", PFM_SONAME);
        dlclose(pfm.handle);
        pfm.handle = NULL;
        return false;
    }
    pfm.init_ret = pfm.initialize();
    if (pfm.init_ret != PFM_SUCCESS)
        snprintf(pfm.why, sizeof pfm.why, "libpfm4 failed to initialize: %s", pfm.strerror(pfm.init_ret));
    return pfm.init_ret == PFM_SUCCESS;
}

static void pfm_close(void)
{
    if (!pfm.handle)
        return;
    if (pfm.init_ret == PFM_SUCCESS)
        pfm.terminate();
    dlclose(pfm.handle);
    pfm.handle = NULL;
    pfm.init_ret = PFM_ERR_NOINIT;
}

/* ---- names resolved ahead --------------------------------------------------------------- */

/* 'alloclens run' resolves the names once, with libpfm4, and hands their encodings to the
 * processes it profiles (ALLOCLENS_EVENT_ATTRS): loading libpfm4 and relocating its tables
 * cost every profiled process about 2 ms at start-up, paid again at each exec of a build or a
 * shell script. The text is ';'-joined "HEX=NAME" entries: HEX the perf_event_attr's bytes,
 * NAME as the user spelled it. A name it lacks is resolved with libpfm4 as before. */
#define AHEAD_MAX (AL_MAX_EVENTS + 8)

static struct {
    char name[sizeof ((struct al_event *)0)->name];
    struct perf_event_attr attr;
} ahead[AHEAD_MAX] AL_LARGE_BSS;
static unsigned nahead;

static bool ahead_find(const char *name, struct perf_event_attr *attr)
{
    for (unsigned i = 0; i < nahead; i++) {
        if (strcmp(ahead[i].name, name) == 0) {
            *attr = ahead[i].attr;
            return true;
        }
    }
    return false;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Nothing is kept from TEXT unless all of it reads. */
bool _al_event_names_load(const char *text)
{
    unsigned n = 0;
    nahead = 0;
    for (const char *p = text; p && *p;) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p), hex = 2 * sizeof(struct perf_event_attr);
        if (n == AHEAD_MAX || len <= hex + 1 || p[hex] != '=' || len - hex - 1 >= sizeof ahead[0].name)
            return false;
        unsigned char *b = (unsigned char *)&ahead[n].attr;
        for (size_t i = 0; i < sizeof(struct perf_event_attr); i++) {
            int hi = hex_digit(p[2 * i]), lo = hex_digit(p[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return false;
            b[i] = (unsigned char)(hi << 4 | lo);
        }
        if (ahead[n].attr.size != sizeof(struct perf_event_attr))
            return false;
        memcpy(ahead[n].name, p + hex + 1, len - hex - 1);
        ahead[n].name[len - hex - 1] = '\0';
        n++;
        p += len + (end != NULL);
    }
    nahead = n;
    return true;
}

int _al_event_resolve(const char *name, struct perf_event_attr *attr, char *err, size_t errcap)
{
    if (err && errcap)
        err[0] = '\0';
    if (name && ahead_find(name, attr))
        return 0;
    if (!pfm_open()) {
        if (err && errcap)
            snprintf(err, errcap, "%s", pfm.why);
        return -ENODEV;
    }
    if (!name)
        name = "";

    memset(attr, 0, sizeof *attr);
    pfm_perf_encode_arg_t arg;
    memset(&arg, 0, sizeof arg);
    arg.attr = attr;
    arg.size = sizeof arg;
    int ret = PFM_ERR_NOTFOUND;
    if (name[0])
        ret = pfm.encode(name, PFM_PLM3, PFM_OS_PERF_EVENT_EXT, &arg);
    if (ret != PFM_SUCCESS) {
        int e = ret == PFM_ERR_NOTFOUND ? -ENOENT : -EINVAL;
        if (err && errcap)
            snprintf(err, errcap, "%s event '%s' (libpfm4: %s)",
                     e == -ENOENT ? "unknown" : "invalid", name, pfm.strerror(ret));
        memset(attr, 0, sizeof *attr);
        return e;
    }
    attr->size = sizeof *attr;
    attr->exclude_kernel = 1;
    attr->exclude_hv = 1;
    return 0;
}

void _al_event_names_done(void)
{
    pfm_close();
}

bool _al_event_next_name(const char **s, char *name, size_t namecap, bool *too_long)
{
    const char *p = *s;
    while (*p == ',' || *p == ' ')
        p++;
    if (!*p)
        return false;
    size_t n = 0;
    *too_long = false;
    while (*p && *p != ',') {
        if (n + 1 < namecap)
            name[n++] = *p;
        else
            *too_long = true;
        p++;
    }
    while (n > 0 && name[n - 1] == ' ')
        n--;
    name[n] = '\0';
    *s = p;
    return true;
}

/* Whether OUT (LEN) has an entry for NAME already (both default sets count page faults). */
static bool encoded(const char *name, const char *out, size_t len)
{
    size_t n = strlen(name);
    for (const char *p = out; p < out + len; p++)
        if (*p == '=' && strncmp(p + 1, name, n) == 0 && (p[1 + n] == ';' || p + 1 + n == out + len))
            return true;
    return false;
}

/* Appends NAME's encoding to OUT (LEN so far, CAP); whether it resolved and fitted. */
static bool encode_one(const char *name, char *out, size_t *len, size_t cap)
{
    struct perf_event_attr attr;
    if (encoded(name, out, *len))
        return true;
    if (_al_event_resolve(name, &attr, NULL, 0) != 0)
        return false;
    size_t need = 2 * sizeof attr + 1 + strlen(name) + 1;
    if (*len + need + 1 > cap)
        return false;
    const unsigned char *b = (const unsigned char *)&attr;
    static const char digits[] = "0123456789abcdef";
    if (*len)
        out[(*len)++] = ';';
    for (size_t i = 0; i < sizeof attr; i++) {
        out[(*len)++] = digits[b[i] >> 4];
        out[(*len)++] = digits[b[i] & 15];
    }
    *len += (size_t)snprintf(out + *len, cap - *len, "=%s", name);
    return true;
}

size_t _al_counters_resolve_ahead(const char *events, char *out, size_t cap)
{
    size_t len = 0;
    const char *lists[2] = { _al_events_default_hw, _al_events_default_sw };
    if (events && strcmp(events, "default") != 0)
        lists[0] = events, lists[1] = "";
    for (unsigned l = 0; l < 2; l++) {
        const char *p = lists[l];
        char name[sizeof ((struct al_event *)0)->name];
        bool too_long;
        while (_al_event_next_name(&p, name, sizeof name, &too_long))
            if (!too_long)
                encode_one(name, out, &len, cap);
    }
    pfm_close();
    if (cap)
        out[len < cap ? len : cap - 1] = '\0';
    return len;
}
