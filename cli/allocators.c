/* Finding allocators on this machine: glibc is the C library this command itself runs on;
 * the others are looked up by their Debian sonames in the library directories. */
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "profiler.h"

static const struct {
    const char *name;
    const char *sonames[3];
} known[AL_MAX_ALLOCATORS] = {
    { "glibc", { NULL } },
    { "jemalloc", { "libjemalloc.so.2", "libjemalloc.so", NULL } },
    { "tcmalloc", { "libtcmalloc.so.4", "libtcmalloc_minimal.so.4", NULL } },
    { "mimalloc", { "libmimalloc.so.2", "libmimalloc.so", NULL } },
};

static const char *const lib_dirs[] = {
    "/usr/local/lib/x86_64-linux-gnu", "/usr/local/lib", "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", NULL,
};

static int find_libc(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *base = strrchr(info->dlpi_name, '/');
    if (base && strncmp(base + 1, "libc.so", 7) == 0) {
        snprintf(data, PATH_MAX, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

/* "libtcmalloc.so.4.5.10" -> "4.5.10": the library's own file name is the best a listing
 * can do without loading it (the report asks the allocator itself). */
static void version_from_file(const char *path, char *out, size_t cap)
{
    char real[PATH_MAX];
    const char *p = realpath(path, real) ? real : path;
    const char *so = strstr(p, ".so.");
    snprintf(out, cap, "%s", so ? so + 4 : "");
}

static bool is_shared_object(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    Elf64_Ehdr eh;
    bool ok = _al_elf64_header(fd, &eh) && eh.e_type == ET_DYN;
    close(fd);
    return ok;
}

/* Whether the library's dynamic symbol table defines malloc: read from the file, without
 * loading the library (its constructors have no business running in this command). */
static bool defines_malloc(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    const unsigned char *f = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f == MAP_FAILED)
        return false;
    size_t size = (size_t)st.st_size;
    bool found = false;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
    if (eh->e_shoff && eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) <= size) {
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
        for (unsigned i = 0; i < eh->e_shnum && !found; i++) {
            if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum)
                continue;
            const Elf64_Shdr *str = &sh[sh[i].sh_link];
            if (sh[i].sh_offset + sh[i].sh_size > size || str->sh_offset + str->sh_size > size)
                break;
            const Elf64_Sym *sym = (const Elf64_Sym *)(f + sh[i].sh_offset);
            size_t n = sh[i].sh_size / sizeof *sym;
            for (size_t k = 0; k < n; k++) {
                if (sym[k].st_shndx == SHN_UNDEF || sym[k].st_name >= str->sh_size)
                    continue;
                const char *name = (const char *)f + str->sh_offset + sym[k].st_name;
                if (strncmp(name, "malloc", str->sh_size - sym[k].st_name) == 0) {
                    found = true;
                    break;
                }
            }
        }
    }
    munmap((void *)f, size);
    return found;
}

static bool lookup(int i, struct al_found_allocator *a)
{
    a->name = known[i].name;
    a->version[0] = '\0';
    if (i == 0) {
        if (!dl_iterate_phdr(find_libc, a->path))
            return false;
        snprintf(a->version, sizeof a->version, "%s", gnu_get_libc_version());
        return true;
    }
    for (int s = 0; known[i].sonames[s]; s++) {
        for (int d = 0; lib_dirs[d]; d++) {
            snprintf(a->path, sizeof a->path, "%s/%s", lib_dirs[d], known[i].sonames[s]);
            if (is_shared_object(a->path)) {
                version_from_file(a->path, a->version, sizeof a->version);
                return true;
            }
        }
    }
    return false;
}

int _al_cli_find_allocators(struct al_found_allocator *out, int cap)
{
    int n = 0;
    for (int i = 0; i < AL_MAX_ALLOCATORS && n < cap; i++)
        if (lookup(i, &out[n]))
            n++;
    return n;
}

int _al_cli_resolve_allocator(const char *arg, struct al_found_allocator *ret)
{
    if (strchr(arg, '/')) {
        if (!realpath(arg, ret->path)) {
            fprintf(stderr, "alloclens: allocator library '%s' does not exist\n", arg);
            return -1;
        }
        if (strpbrk(ret->path, AL_PRELOAD_SEPARATORS)) {
            fprintf(stderr, "alloclens: allocator library '%s' is %s, a path LD_PRELOAD cannot name "
                    "(the loader splits it at spaces and colons): copy it elsewhere\n", arg, ret->path);
            return -1;
        }
        if (!is_shared_object(ret->path)) {
            fprintf(stderr, "alloclens: '%s' is not a 64-bit ELF shared library\n", arg);
            return -1;
        }
        if (!defines_malloc(ret->path)) {
            fprintf(stderr, "alloclens: '%s' defines no malloc: it is not an allocator\n", arg);
            return -1;
        }
        const char *base = strrchr(ret->path, '/');
        ret->name = base ? base + 1 : ret->path;
        version_from_file(ret->path, ret->version, sizeof ret->version);
        return 0;
    }
    for (int i = 0; i < AL_MAX_ALLOCATORS; i++) {
        if (strcmp(arg, known[i].name) != 0)
            continue;
        if (lookup(i, ret))
            return 0;
        fprintf(stderr, "alloclens: allocator '%s' is not installed on this machine\n", arg);
        return -1;
    }
    struct al_found_allocator found[AL_MAX_ALLOCATORS];
    int n = _al_cli_find_allocators(found, AL_MAX_ALLOCATORS);
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strcat(list, i ? ", " : "");
        strcat(list, found[i].name);
    }
    fprintf(stderr, "alloclens: unknown allocator '%s'; found here: %s (or give the path of a shared library)\n",
            arg, n ? list : "none");
    return -1;
}

/* Whether line LINE of a file list ends in the file name NAME. */
static bool named(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    return len > n && line[len - n - 1] == '/' && !strcmp(line + len - n, name);
}

/* Whether dpkg's file list LIST names the file whose real path is REAL, under that name or
 * ALIAS (the name we found it by): dpkg lists a file under the name its package gave it,
 * which since /usr was merged may be /usr/lib/... for a /lib/... we found, or a symbolic link
 * to it. Only lines with one of those names are resolved. */
static bool list_names(const char *list, const char *real, const char *alias)
{
    FILE *f = fopen(list, "re");
    if (!f)
        return false;
    char line[PATH_MAX + 2], line_real[PATH_MAX];
    const char *real_name = strrchr(real, '/') + 1;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\n");
        line[len] = '\0';
        found = (named(line, len, real_name) || named(line, len, alias)) && realpath(line, line_real) &&
                !strcmp(line_real, real);
    }
    fclose(f);
    return found;
}

/* The Version: of package PKG (as dpkg's file lists name it: "libjemalloc2:amd64") in dpkg's
 * status file, into OUT; false if it is not there. */
static bool status_version(const char *pkg, char *out, size_t cap)
{
    FILE *f = fopen("/var/lib/dpkg/status", "re");
    if (!f)
        return false;
    size_t name_len = strcspn(pkg, ":");
    const char *arch = pkg[name_len] ? pkg + name_len + 1 : NULL;
    /* Whole lines, however long (a Depends: line may run to kilobytes; a piece of one read
     * as a line of its own could be taken for a paragraph's end). */
    char *line = NULL;
    size_t line_cap = 0;
    bool in_pkg = false, arch_ok = arch == NULL, found = false;
    char version[256] = "";
    while (getline(&line, &line_cap, f) >= 0) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '\0') { /* end of a paragraph */
            found = in_pkg && arch_ok && version[0];
            if (found)
                break;
            in_pkg = false;
            arch_ok = arch == NULL;
            version[0] = '\0';
        } else if (strncmp(line, "Package: ", 9) == 0) {
            in_pkg = strlen(line + 9) == name_len && strncmp(line + 9, pkg, name_len) == 0;
        } else if (arch && strncmp(line, "Architecture: ", 14) == 0) {
            arch_ok = strcmp(line + 14, arch) == 0;
        } else if (strncmp(line, "Version: ", 9) == 0) {
            snprintf(version, sizeof version, "%.*s", (int)sizeof version - 1, line + 9);
        }
    }
    found = found || (in_pkg && arch_ok && version[0]); /* the last paragraph */
    free(line);
    fclose(f);
    if (found)
        snprintf(out, cap, "%s", version);
    return found;
}

/* The version of the Debian package that installed PATH, into OUT; false where dpkg does not
 * know the file. Read only for the listing: a scan of every package's file list. */
static bool package_version(const char *path, char *out, size_t cap)
{
    char real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    DIR *d = realpath(path, real) && slash ? opendir("/var/lib/dpkg/info") : NULL;
    if (!d)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".list") != 0)
            continue;
        char list[PATH_MAX];
        snprintf(list, sizeof list, "/var/lib/dpkg/info/%s", e->d_name);
        if (list_names(list, real, slash + 1)) {
            char pkg[sizeof e->d_name];
            snprintf(pkg, sizeof pkg, "%.*s", (int)(len - 5), e->d_name);
            found = status_version(pkg, out, cap);
        }
    }
    closedir(d);
    return found;
}

int _al_cli_cmd_allocators(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: alloclens allocators\n\nLists the allocators found on this machine, one a line:\n"
               "NAME<TAB>PATH<TAB>VERSION. Any of the names, or a library path, is a valid -a.\n"
               "VERSION is the C library's own for glibc; for the others, that of the Debian\n"
               "package that installed the library (dpkg's database), else the suffix of its\n"
               "file name.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "alloclens: 'allocators' takes no arguments\n");
        return 2;
    }
    struct al_found_allocator found[AL_MAX_ALLOCATORS];
    int n = _al_cli_find_allocators(found, AL_MAX_ALLOCATORS);
    for (int i = 0; i < n; i++) {
        if (strcmp(found[i].name, "glibc") != 0) /* glibc's version is its own */
            package_version(found[i].path, found[i].version, sizeof found[i].version);
        printf("%s\t%s\t%s\n", found[i].name, found[i].path, found[i].version);
    }
    return 0;
}
