/* Whether LD_PRELOAD reaches a program: not a statically linked one (no interpreter in its ELF
 * headers, so nothing loads what LD_PRELOAD names: Go programs, most often), nor one that is
 * set-user-ID or set-group-ID for someone else, nor one with file capabilities run by anyone
 * but root (the loader runs those securely and ignores LD_PRELOAD's paths). 'alloclens run'
 * asks it of its command, the exec wrappers of what the program execs, so that a report
 * missing for that reason is said to be. And whether the end of a program it reaches can be
 * seen: not a Go program's (cgo's are linked dynamically). */
#include <elf.h>
#include <endian.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <linux/capability.h>

#include "profiler.h"

bool _al_elf64_header(int fd, Elf64_Ehdr *eh)
{
    return pread(fd, eh, sizeof *eh, 0) == (ssize_t)sizeof *eh && memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
           eh->e_ident[EI_CLASS] == ELFCLASS64;
}

static bool statically_linked(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    Elf64_Ehdr eh;
    bool elf = _al_elf64_header(fd, &eh) && eh.e_phentsize == sizeof(Elf64_Phdr);
    bool interp = false;
    for (unsigned i = 0; elf && !interp && i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) != (ssize_t)sizeof ph)
            elf = false;
        else
            interp = ph.p_type == PT_INTERP;
    }
    close(fd);
    return elf && !interp;
}

/* A file system mounted nosuid ignores both the bits and file capabilities. */
static bool nosuid(const char *path)
{
    struct statvfs fs;
    return statvfs(path, &fs) == 0 && (fs.f_flag & ST_NOSUID);
}

static bool changes_identity(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0 || nosuid(path))
        return false;
    return ((st.st_mode & S_ISUID) && st.st_uid != geteuid()) ||
           ((st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP) && st.st_gid != getegid());
}

/* The kernel runs a program securely when its file capabilities (the security.capability
 * attribute) make it effective or give it permitted capabilities, unless the caller is root
 * (real and effective user id 0). Capabilities the bounding set would mask, or inherited ones
 * the caller already holds, are not weighed: such files are rare, and a line too many says
 * only that a report may be missing. */
static bool gains_capabilities(const char *path)
{
    if (getuid() == 0 && geteuid() == 0)
        return false;
    struct vfs_ns_cap_data caps;
    ssize_t n = getxattr(path, "security.capability", &caps, sizeof caps);
    if (n < (ssize_t)XATTR_CAPS_SZ_1 || nosuid(path))
        return false;
    unsigned words = n >= (ssize_t)XATTR_CAPS_SZ_2 ? 2 : 1;
    bool permitted = false;
    for (unsigned i = 0; i < words; i++)
        permitted |= caps.data[i].permitted != 0; /* little-endian, but only zero or not matters */
    return permitted || (le32toh(caps.magic_etc) & VFS_CAP_FLAGS_EFFECTIVE);
}

/* CMD as exec finds it: itself when it names a path or SEARCH is false (execve, execv), else
 * the first executable file of that name in PATH (execvp); false when there is none. */
static bool find_command(const char *cmd, bool search, char *out, size_t cap)
{
    if (!search || strchr(cmd, '/'))
        return (size_t)snprintf(out, cap, "%s", cmd) < cap;
    const char *path = _al_env("PATH");
    for (const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if ((size_t)snprintf(out, cap, "%.*s%s%s", (int)n, p, n ? "/" : "", cmd) < cap &&
            access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

const char *_al_preload_unreachable(const char *cmd, bool search)
{
    char found[PATH_MAX];
    if (!cmd || !find_command(cmd, search, found, sizeof found))
        return NULL;
    if (statically_linked(found))
        return "is statically linked: nothing can be put in front of its allocator";
    if (changes_identity(found))
        return "is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it";
    if (gains_capabilities(found))
        return "has file capabilities (security.capability), run by a user other than root: the loader "
               "ignores LD_PRELOAD for it";
    return NULL;
}

/* Whether NOTES (SIZE bytes, entries aligned to ALIGN from the segment's start) hold Go's build
 * id note: owner "Go" (its linker pads the name to 4 bytes), type 4. */
static bool go_note(const unsigned char *notes, size_t size, size_t align)
{
    size_t off = 0;
    while (off + sizeof(ElfW(Nhdr)) <= size) {
        ElfW(Nhdr) nh;
        memcpy(&nh, notes + off, sizeof nh);
        size_t name = off + sizeof nh;
        if ((nh.n_namesz == 3 || nh.n_namesz == 4) && name + 3 <= size && memcmp(notes + name, "Go", 3) == 0 &&
            nh.n_type == 4)
            return true;
        size_t desc = (name + nh.n_namesz + align - 1) & ~(align - 1);
        off = (desc + nh.n_descsz + align - 1) & ~(align - 1);
    }
    return false;
}

/* The first object dl_iterate_phdr reports is the program itself. */
static int program_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    *(struct dl_phdr_info *)arg = *info;
    return 1;
}

bool _al_program_is_go(void)
{
    struct dl_phdr_info prog = { 0 };
    dl_iterate_phdr(program_object, &prog);
    for (size_t i = 0; prog.dlpi_phdr && i < prog.dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &prog.dlpi_phdr[i];
        if (ph->p_type == PT_NOTE &&
            go_note((const unsigned char *)(prog.dlpi_addr + ph->p_vaddr), ph->p_memsz, ph->p_align >= 8 ? 8 : 4))
            return true;
    }
    return false;
}
