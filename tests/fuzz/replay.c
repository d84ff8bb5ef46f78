/* Replays every file in the directories given (the fuzz corpus and the regression inputs the
 * fuzzer found) through the same checks as the fuzz target, and speaks TAP: "ok N - FILE" per
 * input, the parser's verdict as a comment, "1..N" at the end. Built by meson with the normal
 * compiler (with ASan/UBSan where they link), so no clang or libFuzzer is needed. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config_checks.h"

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The whole file in a buffer of exactly its size, so a read past the end is caught. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n ? n : 1);
    if (buf && fread(buf, 1, n, f) != n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    unsigned n = 0, failed = 0;
    for (int d = 1; d < argc; d++) {
        DIR *dir = opendir(argv[d]);
        if (!dir) {
            printf("not ok %u - %s: %s\n", ++n, argv[d], strerror(errno));
            failed++;
            continue;
        }
        char **names = NULL;
        size_t count = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.')
                continue;
            if (count == cap) {
                cap = cap ? cap * 2 : 64;
                names = realloc(names, cap * sizeof *names);
            }
            names[count++] = strdup(e->d_name);
        }
        closedir(dir);
        if (count == 0) {
            printf("not ok %u - %s: no inputs\n", ++n, argv[d]);
            failed++;
        }
        qsort(names, count, sizeof *names, cmp);
        for (size_t i = 0; i < count; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[d], names[i]);
            const char *shown = strrchr(argv[d], '/') ? strrchr(argv[d], '/') + 1 : argv[d];
            size_t len = 0;
            unsigned char *data = slurp(path, &len);
            char why[1024];
            if (!data) {
                printf("not ok %u - %s/%s: cannot read: %s\n", ++n, shown, names[i], strerror(errno));
                failed++;
            } else if (check_config_input(data, len, why, sizeof why) < 0) {
                printf("not ok %u - %s/%s\n# %s\n", ++n, shown, names[i], why);
                failed++;
            } else {
                char err[512];
                int r = _al_config_parse((const char *)data, len, CHECK_NAME, &check_a, err, sizeof err);
                printf("ok %u - %s/%s\n# %zu bytes, %s\n", ++n, shown, names[i], len,
                       r == 0 ? "accepted" : err);
            }
            free(data);
            free(names[i]);
            fflush(stdout);
        }
        free(names);
    }
    printf("1..%u\n", n);
    return failed ? 1 : 0;
}
