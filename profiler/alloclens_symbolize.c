/* alloclens-symbolize: names the sampled frames of a profiled process, outside it.
 *
 * The profiled process runs this at exit (symbols.c) rather than loading elfutils itself:
 * reading debug information takes megabytes (libc's, where libc6-dbg is installed, is more
 * than a small program's whole heap), and it would come from the allocator being measured.
 *
 * Input (standard input, read whole before anything is written):
 *   the process's /proc/PID/maps text, ended by an empty line;
 *   then a line "@BIAS DEV INO SIZE MTIME_NS PATH" (numbers in hex) for each library the
 *   process unloaded, whose frames were moved to addresses from BIAS up (profiler/unloaded.c):
 *   it is read from PATH if PATH is still that file (a library rebuilt in place since is
 *   another, whose names would be wrong, though it may keep the inode);
 *   then one return address per line, in hex.
 * Output (standard output): for each address, in the same order, a line per function the
 * address is in, innermost first, as addr2line -i has them: where the call is in code inlined
 * from other functions, the innermost inlined function with the address's line, then each
 * function that inlined the one before it, with the line of that inlined call, and last the
 * function the code was compiled into. A line has six tab-separated fields, empty where
 * unknown: function (demangled: C++, and Rust's two schemes), source file, line, module path,
 * the address's offset from the module's load address in hex, and "i" where the function is
 * inlined into the next line's (the same address's), empty on the address's last line. Then a
 * line "end". The call itself is looked up (the byte before the return address). Exit status
 * 0, or 1 with nothing written when the input is malformed or the module map cannot be
 * built. */
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <libiberty/demangle.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Deeper nesting than any compiler emits; past it the innermost DIEs are not looked at. */
#define DEPTH_MAX 128

/* The DIEs whose code holds an address, outermost first. */
struct path {
    Dwarf_Die die[DEPTH_MAX];
    int n;
};

/* DIEs without code of their own whose children may have some: namespaces (Rust puts every
 * function in one, C++ compilers those of namespaces), modules, and the types that hold their
 * member functions. */
static bool holds_functions(int tag)
{
    return tag == DW_TAG_namespace || tag == DW_TAG_module || tag == DW_TAG_structure_type ||
           tag == DW_TAG_class_type || tag == DW_TAG_union_type || tag == DW_TAG_interface_type;
}

/* Appends to P the DIEs under PARENT whose code holds PC, down to the innermost; whether
 * there was one. A walk of our own rather than dwarf_getscopes: that one follows the
 * innermost inlined call's abstract origin instead of the functions it was inlined into, and
 * finds no scope at all where that origin lies outside the unit's scopes (Rust's closures). */
static bool descend(Dwarf_Die *parent, Dwarf_Addr pc, struct path *p)
{
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0)
        return false;
    do {
        if (dwarf_hasattr(&child, DW_AT_low_pc) || dwarf_hasattr(&child, DW_AT_ranges)) {
            if (dwarf_haspc(&child, pc) <= 0)
                continue;
            if (p->n < DEPTH_MAX)
                p->die[p->n++] = child;
            descend(&child, pc, p);
            return true;
        }
        if (holds_functions(dwarf_tag(&child)) && descend(&child, pc, p))
            return true;
    } while (dwarf_siblingof(&child, &child) == 0);
    return false;
}

/* ---- indexes, made once per compile unit and per module ------------------------------------ */

/* A compile unit's functions by address: the DIEs with code that no other DIE with code holds,
 * one entry per address range. Walking the unit's children for every address cost a program
 * of 20000 functions in one file 31 s at its exit. */
struct code_range {
    Dwarf_Addr lo, hi;
    Dwarf_Die die;
};

struct unit_index {
    Dwfl_Module *module;
    Dwarf_Off offset; /* the unit DIE's */
    struct code_range *r;
    size_t n, cap;
};

/* *ARRAY (of *CAP entries of SIZE bytes) made twice as big; false where memory is out. */
static bool grow(void **array, size_t *cap, size_t size)
{
    size_t bigger = *cap ? *cap * 2 : 64;
    void *p = realloc(*array, bigger * size);
    if (!p)
        return false;
    *array = p;
    *cap = bigger;
    return true;
}

/* The index of the first of N entries (SIZE bytes each, sorted by the address at offset AT)
 * that starts past PC: the one before it, if any, is where PC may be. */
static size_t past(const void *base, size_t n, size_t size, size_t at, uint64_t pc)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t start;
        memcpy(&start, (const char *)base + mid * size + at, sizeof start);
        if (start <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void add_ranges(struct unit_index *u, Dwarf_Die *die)
{
    Dwarf_Addr base, lo, hi;
    ptrdiff_t off = 0;
    while ((off = dwarf_ranges(die, off, &base, &lo, &hi)) > 0) {
        if (u->n == u->cap && !grow((void **)&u->r, &u->cap, sizeof *u->r))
            return;
        u->r[u->n++] = (struct code_range){ lo, hi, *die };
    }
}

static void collect(struct unit_index *u, Dwarf_Die *parent)
{
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0)
        return;
    do {
        if (dwarf_hasattr(&child, DW_AT_low_pc) || dwarf_hasattr(&child, DW_AT_ranges))
            add_ranges(u, &child);
        else if (holds_functions(dwarf_tag(&child)))
            collect(u, &child);
    } while (dwarf_siblingof(&child, &child) == 0);
}

static int by_lo(const void *a, const void *b)
{
    Dwarf_Addr x = ((const struct code_range *)a)->lo, y = ((const struct code_range *)b)->lo;
    return x < y ? -1 : x > y;
}

/* The index of unit CU of module M, made at its first use. */
static struct unit_index *unit_of(Dwfl_Module *m, Dwarf_Die *cu)
{
    static struct unit_index *units;
    static size_t nunits, cap;
    Dwarf_Off off = dwarf_dieoffset(cu);
    for (size_t i = nunits; i-- > 0;) /* the last made first: addresses come sorted */
        if (units[i].module == m && units[i].offset == off)
            return &units[i];
    if (nunits == cap && !grow((void **)&units, &cap, sizeof *units))
        return NULL;
    struct unit_index *u = &units[nunits++];
    *u = (struct unit_index){ .module = m, .offset = off };
    collect(u, cu);
    qsort(u->r, u->n, sizeof *u->r, by_lo);
    return u;
}

/* The unit's function DIE holding PC, or NULL. */
static Dwarf_Die *function_at(struct unit_index *u, Dwarf_Addr pc)
{
    size_t lo = past(u->r, u->n, sizeof *u->r, offsetof(struct code_range, lo), pc);
    return lo > 0 && pc < u->r[lo - 1].hi ? &u->r[lo - 1].die : NULL;
}

/* A module's function symbols by address, for the names of code without debug information:
 * dwfl_module_addrname looks at every symbol of the module for each address. */
struct symbol {
    GElf_Addr addr, size;
    const char *name;
    int rank; /* global 0, weak 1, local 2: the first of a place's names is the one shown */
};

struct symbol_index {
    Dwfl_Module *module;
    struct symbol *s;
    size_t n;
};

static int by_addr(const void *a, const void *b)
{
    const struct symbol *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return x->rank - y->rank;
}

static struct symbol_index *symbols_of(Dwfl_Module *m)
{
    static struct symbol_index *mods;
    static size_t nmods, cap;
    for (size_t i = 0; i < nmods; i++)
        if (mods[i].module == m)
            return &mods[i];
    if (nmods == cap && !grow((void **)&mods, &cap, sizeof *mods))
        return NULL;
    struct symbol_index *x = &mods[nmods++];
    *x = (struct symbol_index){ .module = m };
    int n = dwfl_module_getsymtab(m);
    x->s = n > 0 ? malloc((size_t)n * sizeof *x->s) : NULL;
    for (int i = 1; x->s && i < n; i++) {
        GElf_Sym sym;
        GElf_Addr addr;
        const char *name = dwfl_module_getsym_info(m, i, &sym, &addr, NULL, NULL, NULL);
        int type = GELF_ST_TYPE(sym.st_info), bind = GELF_ST_BIND(sym.st_info);
        if (!name || !name[0] || !addr || !sym.st_size || sym.st_shndx == SHN_UNDEF ||
            (type != STT_FUNC && type != STT_GNU_IFUNC))
            continue;
        x->s[x->n++] = (struct symbol){ addr, sym.st_size, name, bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2 };
    }
    qsort(x->s, x->n, sizeof *x->s, by_addr);
    return x;
}

/* The name of the function symbol holding PC in module M (the best-ranked of its names). */
static const char *symbol_at(Dwfl_Module *m, GElf_Addr pc)
{
    struct symbol_index *x = symbols_of(m);
    if (!x || !x->n)
        return dwfl_module_addrname(m, pc);
    size_t lo = past(x->s, x->n, sizeof *x->s, offsetof(struct symbol, addr), pc);
    if (lo == 0)
        return dwfl_module_addrname(m, pc);
    GElf_Addr at = x->s[lo - 1].addr;
    while (lo > 1 && x->s[lo - 2].addr == at) /* the place's first name */
        lo--;
    const struct symbol *s = &x->s[lo - 1];
    /* Outside every sized function (a PLT, padding, an assembly label without size or type):
     * elfutils' own choice, rare enough for its look at every symbol. */
    return pc < s->addr + s->size ? s->name : dwfl_module_addrname(m, pc);
}

/* ---- names --------------------------------------------------------------------------------- */

/* The name of the function DIE is (an inlined call's is its abstract origin's), its linkage
 * name where it has one: that one demangles to the full path (C++'s parameters, Rust's
 * module path), where DW_AT_name is the bare name. */
static const char *die_function(Dwarf_Die *die)
{
    Dwarf_Attribute attr;
    const char *name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
    if (!name)
        name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
    return name ? name : dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &attr));
}

/* The file and line of the inlined call DIE (DW_AT_call_file indexes its unit's file table). */
static void call_site(Dwarf_Die *die, const char **file, int *line)
{
    Dwarf_Attribute attr;
    Dwarf_Word v;
    Dwarf_Die cu;
    Dwarf_Files *files;
    *file = NULL;
    *line = 0;
    if (dwarf_formudata(dwarf_attr(die, DW_AT_call_file, &attr), &v) == 0 && dwarf_diecu(die, &cu, NULL, NULL) &&
        dwarf_getsrcfiles(&cu, &files, NULL) == 0)
        *file = dwarf_filesrc(files, v, NULL, NULL);
    if (*file && dwarf_formudata(dwarf_attr(die, DW_AT_call_line, &attr), &v) == 0)
        *line = (int)v;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *bigger = realloc(buf, cap * 2 + 1);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* Tabs and newlines would break the line format; no real name has them. */
static void put_field(const char *s)
{
    for (; s && *s; s++)
        putchar(*s == '\t' || *s == '\n' ? '?' : *s);
}

/* One output line. Names are demangled as c++filt does by default (parameters, no Rust
 * hash): libiberty tries Rust's legacy scheme before C++'s, whose syntax it shares, and
 * knows Rust's v0 scheme ("_R"), which the C++ runtime's __cxa_demangle does not. */
static void put_frame(const char *fn, const char *file, int line, Dwfl_Module *m, Dwarf_Addr pc, bool inlined)
{
    char *plain = fn ? cplus_demangle(fn, DMGL_PARAMS | DMGL_ANSI | DMGL_AUTO) : NULL;
    put_field(plain ? plain : fn);
    free(plain);
    putchar('\t');
    put_field(file);
    if (file && line > 0)
        printf("\t%d\t", line);
    else
        fputs("\t\t", stdout);
    Dwarf_Addr base = 0;
    if (m) {
        put_field(dwfl_module_info(m, NULL, &base, NULL, NULL, NULL, NULL, NULL));
        printf("\t%" PRIx64, (uint64_t)(pc - base));
    } else {
        putchar('\t');
    }
    puts(inlined ? "\ti" : "\t");
}

/* The lines of return address PC: the call at PC - 1, expanded into its inlined calls. */
static void put_address(Dwfl *dwfl, Dwarf_Addr pc)
{
    Dwfl_Module *m = pc ? dwfl_addrmodule(dwfl, pc - 1) : NULL;
    if (!m) {
        put_frame(NULL, NULL, 0, NULL, pc, false);
        return;
    }
    /* The symbol table's name for the function the code is in (there without debug
     * information too); the line table's line, the innermost inlined call's. */
    const char *fn = symbol_at(m, pc - 1), *file = NULL;
    int line = 0;
    Dwfl_Line *l = dwfl_module_getsrc(m, pc - 1);
    if (l)
        file = dwfl_lineinfo(l, NULL, &line, NULL, NULL, NULL);
    static struct path p;
    p.n = 0;
    Dwarf_Addr bias;
    Dwarf_Die *cu = l ? dwfl_module_addrdie(m, pc - 1, &bias) : NULL;
    struct unit_index *u = cu ? unit_of(m, cu) : NULL;
    Dwarf_Die *function = u ? function_at(u, pc - 1 - bias) : NULL;
    if (function) {
        p.die[p.n++] = *function;
        descend(function, pc - 1 - bias, &p);
    }
    int outer = p.n - 1; /* the function the code was compiled into */
    while (outer >= 0 && dwarf_tag(&p.die[outer]) != DW_TAG_subprogram)
        outer--;
    for (int i = p.n - 1; i > outer; i--) {
        if (dwarf_tag(&p.die[i]) != DW_TAG_inlined_subroutine)
            continue;
        put_frame(die_function(&p.die[i]), file, line, m, pc, true);
        call_site(&p.die[i], &file, &line);
    }
    if (!fn && outer >= 0)
        fn = die_function(&p.die[outer]);
    put_frame(fn, file, line, m, pc, false);
}

int main(void)
{
    size_t len;
    char *in = read_all(stdin, &len);
    char *end_of_maps = in ? strstr(in, "\n\n") : NULL;
    if (!end_of_maps)
        return 1;
    end_of_maps[1] = '\0';
    char *pcs = end_of_maps + 2;

    static const Dwfl_Callbacks callbacks = {
        .find_elf = dwfl_linux_proc_find_elf,
        .find_debuginfo = dwfl_standard_find_debuginfo,
    };
    Dwfl *dwfl = dwfl_begin(&callbacks);
    FILE *maps = fmemopen(in, (size_t)(end_of_maps + 1 - in), "r");
    if (!dwfl || !maps)
        return 1;
    dwfl_report_begin(dwfl);
    if (dwfl_linux_proc_maps_report(dwfl, maps) != 0)
        return 1;
    /* A library that cannot be read any more is left unnamed: its frames are then named by
     * the process from what it noted. */
    while (pcs[0] == '@') {
        char *nl = strchr(pcs, '\n'), *p = pcs + 1;
        if (!nl)
            return 1;
        *nl = '\0';
        uint64_t bias = strtoull(p, &p, 16), dev = strtoull(p, &p, 16), ino = strtoull(p, &p, 16);
        uint64_t size = strtoull(p, &p, 16), mtime_ns = strtoull(p, &p, 16);
        struct stat st;
        if (*p++ != ' ')
            return 1;
        if (stat(p, &st) == 0 && st.st_dev == dev && st.st_ino == ino && (uint64_t)st.st_size == size &&
            (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec == mtime_ns)
            dwfl_report_elf(dwfl, p, p, -1, bias, false);
        pcs = nl + 1;
    }
    if (dwfl_report_end(dwfl, NULL, NULL) != 0)
        return 1;
    fclose(maps);

    for (char *line = strtok(pcs, "\n"); line; line = strtok(NULL, "\n"))
        put_address(dwfl, strtoull(line, NULL, 16));
    fputs("end\n", stdout);
    return fflush(stdout) == 0 ? 0 : 1;
}
