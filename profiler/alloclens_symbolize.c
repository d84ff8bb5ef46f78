/* alloclens-symbolize: names the sampled frames of a profiled process, outside it.
 *
 * The profiled process runs this at exit (symbols.c) rather than loading elfutils itself:
 * reading debug information takes megabytes (libc's, where libc6-dbg is installed, is more
 * than a small program's whole heap), and it would come from the allocator being measured.
 *
 * Input (standard input, read whole before anything is written):
 *   the process's /proc/PID/maps text, ended by an empty line;
 *   then a line "@BIAS PATH" (BIAS in hex) for each library the process unloaded, whose frames
 *   were moved to addresses from BIAS up (profiler/unloaded.c): it is read from PATH;
 *   then one return address per line, in hex.
 * Output (standard output): a line per address, in the same order, of five tab-separated
 * fields, empty where unknown: function (demangled: C++, and Rust's two schemes; the innermost
 * inlined call's, whose line it is), source file, line, module path, and the
 * address's offset from the module's load address in hex; then a line "end". The call itself
 * is looked up (the byte before the return address). Exit status 0, or 1 with nothing written
 * when the input is malformed or the module map cannot be built. */
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <libiberty/demangle.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The function of the innermost inlined call holding PC, whose source line the line table
 * gives for PC; NULL where PC is in no inlined call (the symbol table's name is its own). */
static const char *inlined_function(Dwfl_Module *m, Dwarf_Addr pc)
{
    Dwarf_Addr bias;
    Dwarf_Die *cu = dwfl_module_addrdie(m, pc, &bias);
    Dwarf_Die *scopes = NULL;
    int n = cu ? dwarf_getscopes(cu, pc - bias, &scopes) : 0;
    const char *name = NULL;
    for (int i = 0; i < n && !name; i++) {
        if (dwarf_tag(&scopes[i]) == DW_TAG_subprogram)
            break;
        if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine)
            continue;
        Dwarf_Attribute attr;
        name = dwarf_formstring(dwarf_attr_integrate(&scopes[i], DW_AT_linkage_name, &attr));
        if (!name)
            name = dwarf_formstring(dwarf_attr_integrate(&scopes[i], DW_AT_name, &attr));
    }
    free(scopes);
    return name;
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
        char *nl = strchr(pcs, '\n'), *path = strchr(pcs, ' ');
        if (!nl || !path || path > nl)
            return 1;
        *nl = '\0';
        dwfl_report_elf(dwfl, path + 1, path + 1, -1, strtoull(pcs + 1, NULL, 16), false);
        pcs = nl + 1;
    }
    if (dwfl_report_end(dwfl, NULL, NULL) != 0)
        return 1;
    fclose(maps);

    for (char *line = strtok(pcs, "\n"); line; line = strtok(NULL, "\n")) {
        Dwarf_Addr pc = strtoull(line, NULL, 16);
        Dwfl_Module *m = pc ? dwfl_addrmodule(dwfl, pc - 1) : NULL;
        const char *fn = NULL, *file = NULL, *module = NULL;
        int lineno = 0;
        Dwarf_Addr base = 0;
        if (m) {
            module = dwfl_module_info(m, NULL, &base, NULL, NULL, NULL, NULL, NULL);
            fn = dwfl_module_addrname(m, pc - 1);
            Dwfl_Line *l = dwfl_module_getsrc(m, pc - 1);
            if (l) {
                file = dwfl_lineinfo(l, NULL, &lineno, NULL, NULL, NULL);
                /* The line is the innermost inlined call's: so is the name. */
                const char *inner = inlined_function(m, pc - 1);
                if (inner)
                    fn = inner;
            }
        }
        /* As c++filt does by default (parameters, no Rust hash): libiberty tries Rust's legacy
         * scheme before C++'s, whose syntax it shares, and knows Rust's v0 scheme ("_R"),
         * which the C++ runtime's __cxa_demangle does not. */
        char *plain = fn ? cplus_demangle(fn, DMGL_PARAMS | DMGL_ANSI | DMGL_AUTO) : NULL;
        if (plain)
            fn = plain;
        put_field(fn);
        putchar('\t');
        put_field(file);
        if (file && lineno > 0)
            printf("\t%d\t", lineno);
        else
            fputs("\t\t", stdout);
        put_field(module);
        if (m)
            printf("\t%" PRIx64 "\n", (uint64_t)(pc - base));
        else
            fputs("\t\n", stdout);
        free(plain);
    }
    fputs("end\n", stdout);
    return fflush(stdout) == 0 ? 0 : 1;
}
