/* The alloclens command: subcommand dispatch, top-level help, finding the files that ship
 * beside it (the preload library, the demo workload) in a build tree or an install, and
 * checking that an output file can be written before anything runs. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "cli.h"
#include "profiler.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: alloclens COMMAND [ARGS...]\n"
            "\n"
            "Profiles the memory allocator behind a program: every malloc-family call and C++\n"
            "operator new/delete is timed in front of the allocator you choose.\n"
            "\n"
            "commands:\n"
            "  run [-a ALLOCATOR] [-o REPORT.json] [options] -- CMD [ARGS...]\n"
            "                 run CMD under the profiler; report on stderr at exit\n"
            "  prerun -a ALLOCATOR [-o FILE]\n"
            "                 probe an allocator: style, size classes, large threshold\n"
            "  compare [-a A,B,...] [-n RUNS] [-o FILE.json] -- CMD [ARGS...]\n"
            "                 run CMD under each allocator; a side-by-side table of medians\n"
            "  report REPORT.json [--html OUT.html]\n"
            "                 render a saved report again, as text or as an HTML page\n"
            "  allocators     list the allocators found on this machine (name, path, version)\n"
            "  demo           profile the bundled workload under every allocator found\n"
            "  options        the table of every tunable (environment variable, default, range)\n"
            "  help           this text; 'alloclens run --help' lists every run option\n"
            "\n"
            "Exit status: run ends with CMD's own (or 126/127 when CMD cannot be run); every\n"
            "command gives 2 for bad arguments (an output file that cannot be made among them:\n"
            "it is checked before any work), and 1 when its work or a write of its output failed.\n"
            "\n"
            "alloclens %s\n",
            ALLOCLENS_VERSION);
}

int _al_cli_self_exe(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0)
        return -1;
    out[n] = '\0';
    return 0;
}

int _al_cli_sibling(const char *build_rel, const char *install_name, char *out, size_t cap)
{
    char self[PATH_MAX];
    if (_al_cli_self_exe(self, sizeof self) == 0) {
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(out, cap, "%s/%s", self, build_rel);
            if (access(out, R_OK) == 0)
                return 0;
        }
    }
    snprintf(out, cap, "%s/%s", ALLOCLENS_INSTALL_LIBDIR, install_name);
    return access(out, R_OK) == 0 ? 0 : -1;
}

int _al_cli_value_given(const char *opt, const char *value, bool is_option)
{
    if (!strcmp(value, "--"))
        fprintf(stderr, "alloclens: option '%s' needs a value; got '--', which ends the options\n", opt);
    else if (is_option)
        fprintf(stderr, "alloclens: option '%s' needs a value; got the option '%s'\n", opt, value);
    else
        return 0;
    return -1;
}

int _al_cli_once(const char *opt, const char *before, const char *value)
{
    if (!before)
        return 0;
    char a[256], b[256];
    fprintf(stderr, "alloclens: option '%.*s' given twice ('%s', then '%s'): give it once\n",
            (int)strcspn(opt, "="), opt, _al_cli_escaped(before, a, sizeof a), _al_cli_escaped(value, b, sizeof b));
    return -1;
}

const char *_al_cli_escaped(const char *s, char *out, size_t cap)
{
    out[_al_escape_controls(s, strlen(s), out, cap - 1)] = '\0';
    return out;
}

int _al_cli_check_mode(const char *mode)
{
    if (_al_mode_parse(mode) >= 0)
        return 0;
    char shown[256];
    fprintf(stderr, "alloclens: --mode takes full, time or sample, not '%s'\n",
            _al_cli_escaped(mode, shown, sizeof shown));
    return -1;
}

int _al_cli_check_writable(const char *path, const char *shown, const char *what)
{
    /* Fail now rather than after the run; leave no empty file behind. A FIFO is only asked:
     * opening it waits for a reader, and closing it again ends that reader's input before
     * the report comes. */
    struct stat st;
    if (stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        if (access(path, W_OK) == 0)
            return 0;
        fprintf(stderr, "alloclens: cannot write %s to %s: %s\n", what, shown, strerror(errno));
        return -1;
    }
    bool existed = access(path, F_OK) == 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "alloclens: cannot write %s to %s: %s\n", what, shown, strerror(errno));
        return -1;
    }
    close(fd);
    if (!existed) {
        /* Made through a symbolic link to nothing, the new file is the link's target: that
         * one goes, the link stays. */
        char real[PATH_MAX];
        unlink(realpath(path, real) ? real : path);
    }
    return 0;
}

/* What a command printed, flushed: a full disk or a closed stdout is said, not lost. */
static int stdout_written(int rc)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return rc;
    fprintf(stderr, "alloclens: writing to stdout failed: %s\n", strerror(errno ? errno : EIO));
    return rc ? rc : 1;
}

static int dispatch(const char *cmd, int argc, char **argv)
{
    if (!strcmp(cmd, "run"))
        return _al_cli_cmd_run(argc, argv);
    if (!strcmp(cmd, "allocators"))
        return _al_cli_cmd_allocators(argc, argv);
    if (!strcmp(cmd, "compare"))
        return _al_cli_cmd_compare(argc, argv);
    if (!strcmp(cmd, "report"))
        return _al_cli_cmd_report(argc, argv);
    if (!strcmp(cmd, "demo"))
        return _al_cli_cmd_demo(argc, argv);
    if (!strcmp(cmd, "prerun"))
        return _al_cli_cmd_prerun(argc, argv);
    if (!strcmp(cmd, "options"))
        return _al_cli_cmd_options(argc, argv);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("alloclens %s\n", ALLOCLENS_VERSION);
        return 0;
    }
    fprintf(stderr, "alloclens: unknown command '%s' (try 'alloclens --help')\n", cmd);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    return stdout_written(dispatch(argv[1], argc - 1, argv + 1));
}
