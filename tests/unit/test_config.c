/* Unit tests of config/: the allocator description's strict parser (every error is NAME:LINE and
 * leaves the config empty), the writer (format -> parse gives the same config back), loading
 * files, and the O(1) size -> class table against a brute-force search for every size. */
#include <check.h>

#include "check_main.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc_config.h"

/* The configs are 130 KiB each: keep them off the stack. */
static struct al_alloc_config cfg, cfg2;
static char err[1024];
static char text[1 << 20], text2[1 << 20];

/* Every key but the threshold and the classes: five lines. */
#define BASE_HEAD                                                                           \
    "alloclens-config 1\n"               /* 1 */                                           \
    "allocator /usr/lib/libfoo.so\n"     /* 2 */                                           \
    "identity 2049 1835122 751832 1667923200000000000\n" /* 3 */                           \
    "style bibop\n"                      /* 4 */                                           \
    "page_size 4096\n"                   /* 5 */

#define BASE                                                                                \
    BASE_HEAD                                                                               \
    "large_threshold 33\n"               /* 6 */                                           \
    "size_classes 8 16 32\n"             /* 7 */

static int parse(const char *t, size_t len)
{
    memset(&cfg, 0xa5, offsetof(struct al_alloc_config, classes)); /* garbage in */
    err[0] = '\0';
    return _al_config_parse(t, len, "t.conf", &cfg, err, sizeof err);
}

static int parse_str(const char *t)
{
    return parse(t, strlen(t));
}

static bool same_config(const struct al_alloc_config *a, const struct al_alloc_config *b)
{
    return strcmp(a->allocator, b->allocator) == 0 && _al_config_identity_equal(&a->identity, &b->identity) &&
           a->style == b->style && a->page_size == b->page_size && a->large_threshold == b->large_threshold &&
           strcmp(a->confidence, b->confidence) == 0 && a->nclasses == b->nclasses &&
           memcmp(a->classes, b->classes, a->nclasses * sizeof a->classes[0]) == 0;
}

/* Parses T (length LEN), expecting failure at LINE with WHAT in the message and nothing left. */
static void expect_error_len(const char *t, size_t len, unsigned line, const char *what)
{
    char prefix[64];
    int r = parse(t, len);
    ck_assert_msg(r == -EINVAL, "accepted (%d):\n%.*s", r, (int)(len > 300 ? 300 : len), t);
    snprintf(prefix, sizeof prefix, "t.conf:%u: ", line);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "'%s' does not start with '%s'", err, prefix);
    ck_assert_msg(strstr(err, what) != NULL, "'%s' does not say '%s'", err, what);
    ck_assert_uint_eq(cfg.nclasses, 0);
    ck_assert_uint_eq(cfg.large_threshold, 0);
    ck_assert_uint_eq(cfg.page_size, 0);
    ck_assert_str_eq(cfg.allocator, "");
}

static void expect_error(const char *t, unsigned line, const char *what)
{
    expect_error_len(t, strlen(t), line, what);
}

START_TEST(parse_valid_base)
{
    ck_assert_int_eq(parse_str(BASE "confidence high: every boundary seen twice\n"), 0);
    ck_assert_str_eq(cfg.allocator, "/usr/lib/libfoo.so");
    ck_assert_uint_eq(cfg.identity.dev, 2049);
    ck_assert_uint_eq(cfg.identity.ino, 1835122);
    ck_assert_uint_eq(cfg.identity.size, 751832);
    ck_assert_int_eq(cfg.identity.mtime_ns, 1667923200000000000);
    ck_assert_int_eq(cfg.style, AL_STYLE_BIBOP);
    ck_assert_uint_eq(cfg.page_size, 4096);
    ck_assert_uint_eq(cfg.large_threshold, 33);
    ck_assert_uint_eq(cfg.nclasses, 3);
    ck_assert_uint_eq(cfg.classes[0], 8);
    ck_assert_uint_eq(cfg.classes[1], 16);
    ck_assert_uint_eq(cfg.classes[2], 32);
    ck_assert_str_eq(cfg.confidence, "high: every boundary seen twice");

    /* confidence is optional; sequential; keys in any order; the largest numbers allowed */
    ck_assert_int_eq(parse_str("alloclens-config 1\n"
                               "size_classes 1 9223372036854775807\n"
                               "large_threshold 1099511627776\n"
                               "page_size 512\n"
                               "style sequential\n"
                               "identity 18446744073709551615 0 0 0\n"
                               "allocator /x\n"),
                     -EINVAL); /* 2^64 - 1 is too large */
    ck_assert_int_eq(parse_str("alloclens-config 1\n"
                               "size_classes 1 9223372036854775807\n"
                               "large_threshold 1099511627776\n"
                               "page_size 512\n"
                               "style sequential\n"
                               "identity 9223372036854775807 0 0 9223372036854775807\n"
                               "allocator /x\n"),
                     0);
    ck_assert_int_eq(cfg.style, AL_STYLE_SEQUENTIAL);
    ck_assert_str_eq(cfg.confidence, "");
    ck_assert_uint_eq(cfg.large_threshold, 1ull << 40);
    ck_assert_uint_eq(cfg.classes[1], INT64_MAX);
    ck_assert_uint_eq(cfg.identity.dev, INT64_MAX);
    ck_assert_int_eq(cfg.identity.mtime_ns, INT64_MAX);
    /* the smallest valid threshold: one above the first class; the largest: one above the last */
    ck_assert_int_eq(parse_str(BASE), 0);
    ck_assert_int_eq(parse_str("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\n"
                               "page_size 4096\nlarge_threshold 9\nsize_classes 8 16 32\n"),
                     0);
    ck_assert_uint_eq(cfg.large_threshold, 9);
    /* a file dated before 1970 */
    ck_assert_int_eq(parse_str("alloclens-config 1\nallocator /l\nidentity 1 2 3 -5000000000\nstyle bibop\n"
                               "page_size 4096\nlarge_threshold 9\nsize_classes 8\n"),
                     0);
    ck_assert_int_eq(cfg.identity.mtime_ns, -5000000000);
}
END_TEST

START_TEST(parse_layout_accepted)
{
    ck_assert_int_eq(parse_str(BASE "confidence high\n"), 0);
    struct al_alloc_config want = cfg;

    /* CRLF line endings */
    const char *crlf = "alloclens-config 1\r\nallocator /usr/lib/libfoo.so\r\n"
                       "identity 2049 1835122 751832 1667923200000000000\r\nstyle bibop\r\npage_size 4096\r\n"
                       "large_threshold 33\r\nsize_classes 8 16 32\r\nconfidence high\r\n";
    ck_assert_int_eq(parse_str(crlf), 0);
    ck_assert(same_config(&cfg, &want));

    /* comments, blank lines, indentation, tabs, trailing blanks, classes over several lines, no
     * final newline */
    const char *loose = "  alloclens-config \t 1  \n"
                        "\n"
                        "# a comment\n"
                        "   # an indented comment: size_classes 1 2 3\n"
                        "size_classes 8\n"
                        "\t\n"
                        "allocator /usr/lib/libfoo.so   \n"
                        "identity\t2049  1835122\t751832 1667923200000000000\n"
                        "size_classes\t16 \n"
                        "style bibop\t\n"
                        "#\n"
                        "page_size   4096\n"
                        "\tlarge_threshold 33\n"
                        "size_classes 32\n"
                        "confidence \t high   ";
    ck_assert_int_eq(parse_str(loose), 0);
    ck_assert(same_config(&cfg, &want));

    /* CRLF and a comment line that ends in CR */
    snprintf(text, sizeof text, "alloclens-config 1\r\n# c\r\n\r\n%s", &BASE[19]);
    ck_assert_int_eq(parse_str(text), 0);
    ck_assert_uint_eq(cfg.nclasses, 3);
    ck_assert_uint_eq(cfg.large_threshold, 33);

    /* the allocator path may hold spaces; the confidence anything printable */
    ck_assert_int_eq(parse_str(BASE "confidence low: 3 of 5 runs agree; # not a comment \xc3\xa9\n"), 0);
    ck_assert_str_eq(cfg.confidence, "low: 3 of 5 runs agree; # not a comment \xc3\xa9");
    ck_assert_int_eq(parse_str("alloclens-config 1\nallocator /opt/my libs/liba.so\nidentity 0 0 0 0\n"
                               "style bibop\npage_size 4096\nlarge_threshold 9\nsize_classes 8\nconfidence\n"),
                     0);
    ck_assert_str_eq(cfg.allocator, "/opt/my libs/liba.so");
    ck_assert_str_eq(cfg.confidence, "");
}
END_TEST

START_TEST(parse_errors_lines)
{
    /* version line */
    expect_error("", 1, "empty file");
    expect_error("\n", 1, "expected the version line");
    expect_error("# comment first\nalloclens-config 1\n", 1, "expected the version line");
    expect_error("allocator /x\n", 1, "expected the version line");
    expect_error("alloclens-config\n", 1, "expected the version line");
    expect_error("alloclens-config1\n", 1, "expected the version line");
    expect_error("alloclens-configs 1\n", 1, "expected the version line");
    expect_error("ALLOCLENS-CONFIG 1\n", 1, "expected the version line");
    expect_error("alloclens-config 2\n", 1, "unsupported version");
    expect_error("alloclens-config 0\n", 1, "unsupported version");
    expect_error("alloclens-config 1 extra\n", 1, "unsupported version");
    expect_error("alloclens-config 1.0\n", 1, "'.' after a number");
    expect_error("alloclens-config x\n", 1, "expected a decimal number");
    expect_error("alloclens-config 99999999999999999999\n", 1, "number too large");

    /* keys */
    expect_error(BASE "colour blue\n", 8, "unknown key 'colour'");
    expect_error(BASE "Style bibop\n", 8, "unknown key 'Style'");
    expect_error(BASE "size_class 64\n", 8, "unknown key 'size_class'");
    expect_error("alloclens-config 1\nallocator /x\nallocator /y\n", 3, "allocator given twice");
    expect_error(BASE "style sequential\n", 8, "style given twice");
    expect_error(BASE "identity 1 2 3 4\n", 8, "identity given twice");
    expect_error(BASE "page_size 4096\n", 8, "page_size given twice");
    expect_error(BASE "large_threshold 33\n", 8, "large_threshold given twice");
    expect_error(BASE "confidence a\nconfidence b\n", 9, "confidence given twice");
    expect_error(BASE "page_size\n", 8, "page_size given twice");
    expect_error("alloclens-config 1\npage_size\n", 2, "page_size: missing value");
    expect_error("alloclens-config 1\nsize_classes \t \n", 2, "size_classes: missing value");
    expect_error("alloclens-config 1\nallocator\n", 2, "allocator: missing value");

    /* missing keys: reported on the line after the last */
    expect_error("alloclens-config 1\n", 2, "missing key 'allocator'");
    expect_error("alloclens-config 1", 2, "missing key 'allocator'");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "large_threshold 9\n\n# end\n",
                 9, "missing key 'size_classes'");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\n"
                 "large_threshold 9\nsize_classes 8",
                 7, "missing key 'page_size'");
    expect_error("alloclens-config 1\nallocator /l\nstyle bibop\npage_size 4096\n"
                 "large_threshold 9\nsize_classes 8\n",
                 7, "missing key 'identity'");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\npage_size 4096\n"
                 "large_threshold 9\nsize_classes 8\n",
                 7, "missing key 'style'");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "size_classes 8\n",
                 7, "missing key 'large_threshold'");

    /* numbers */
    expect_error("alloclens-config 1\npage_size 4k\n", 2, "page_size: 'k' after a number");
    expect_error("alloclens-config 1\npage_size -4096\n", 2, "page_size: expected a decimal number");
    expect_error("alloclens-config 1\npage_size +4096\n", 2, "page_size: expected a decimal number");
    expect_error("alloclens-config 1\npage_size 0x1000\n", 2, "'x' after a number");
    expect_error("alloclens-config 1\npage_size 99999999999999999999999\n", 2, "page_size: number too large");
    expect_error("alloclens-config 1\nidentity 1 2 3 9223372036854775808\n", 2, "identity: number too large");
    expect_error("alloclens-config 1\nidentity 1 2 3 -9223372036854775808\n", 2, "identity: number too large");
    expect_error("alloclens-config 1\nidentity 18446744073709551616 2 3 4\n", 2, "identity: number too large");
    expect_error("alloclens-config 1\nidentity 1 2 3\n", 2, "identity: expected a decimal number");
    expect_error("alloclens-config 1\nidentity 1 2 3 -\n", 2, "identity: expected a decimal number");
    expect_error("alloclens-config 1\nidentity 1 2 3 --4\n", 2, "identity: expected a decimal number");
    expect_error("alloclens-config 1\nidentity 1 -2 3 4\n", 2, "identity: expected a decimal number");
    expect_error("alloclens-config 1\nidentity 1,2,3,4\n", 2, "identity: ',' after a number");
    expect_error("alloclens-config 1\n\n\nsize_classes 8 16 99999999999999999999\n", 4,
                 "size_classes: number too large");
    expect_error("alloclens-config 1\nsize_classes 8 16 9223372036854775808\n", 2, "size_classes: number too large");
    expect_error("alloclens-config 1\nlarge_threshold 18446744073709551616\n", 2, "number too large");

    /* trailing text */
    expect_error("alloclens-config 1\npage_size 4096 8192\n", 2, "page_size: unexpected text after the value");
    expect_error("alloclens-config 1\nlarge_threshold 33 # why\n", 2, "large_threshold: unexpected text");
    expect_error("alloclens-config 1\nidentity 1 2 3 4 5\n", 2, "identity: unexpected text after the value");
    expect_error("alloclens-config 1\nsize_classes 8 16 # more\n", 2, "size_classes: expected a decimal number");
    expect_error("alloclens-config 1\nstyle bibop sequential\n", 2, "style: expected 'bibop' or 'sequential'");

    /* classes */
    expect_error("alloclens-config 1\nsize_classes 0 8\n", 2, "size_classes: a class of 0 bytes");
    expect_error("alloclens-config 1\nsize_classes 8 16 16\n", 2, "size_classes: 16 is not above the class before it");
    expect_error("alloclens-config 1\nsize_classes 8 16 12\n", 2, "12 is not above the class before it");
    expect_error("alloclens-config 1\nsize_classes 8 16\n# more\nsize_classes 32 24\n", 4,
                 "24 is not above the class before it");
    expect_error("alloclens-config 1\nsize_classes 8 16\nsize_classes 16\n", 3, "16 is not above");

    /* style, page size, allocator */
    expect_error("alloclens-config 1\nstyle buddy\n", 2, "style: expected 'bibop' or 'sequential'");
    expect_error("alloclens-config 1\nstyle Bibop\n", 2, "style: expected 'bibop' or 'sequential'");
    expect_error("alloclens-config 1\nstyle bibopx\n", 2, "style: expected");
    expect_error("alloclens-config 1\nstyle sequentia\n", 2, "style: expected");
    expect_error("alloclens-config 1\npage_size 4095\n", 2, "page_size: not a power of two of at least 512");
    expect_error("alloclens-config 1\npage_size 256\n", 2, "page_size: not a power of two of at least 512");
    expect_error("alloclens-config 1\npage_size 0\n", 2, "page_size: not a power of two");
    expect_error("alloclens-config 1\npage_size 12288\n", 2, "page_size: not a power of two");
    expect_error("alloclens-config 1\nallocator libc.so.6\n", 2, "allocator: not an absolute path");
    expect_error("alloclens-config 1\nallocator ./libc.so.6\n", 2, "allocator: not an absolute path");

    /* threshold against the classes: checked at the end */
    expect_error("alloclens-config 1\nlarge_threshold 1\n", 2, "large_threshold: outside 2..2^40");
    expect_error("alloclens-config 1\nlarge_threshold 0\n", 2, "large_threshold: outside 2..2^40");
    expect_error("alloclens-config 1\nlarge_threshold 1099511627777\n", 2, "large_threshold: outside 2..2^40");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "large_threshold 34\nsize_classes 8 16 32\n",
                 8, "large_threshold 34: requests from 33 up are in no size class");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "large_threshold 131072\nsize_classes 8 16 32\n# end",
                 9, "requests from 33 up are in no size class");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "large_threshold 8\nsize_classes 8 16 32\n",
                 8, "large_threshold 8: at or below the smallest size class");
    expect_error("alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                 "large_threshold 4\nsize_classes 8 16 32\n",
                 8, "at or below the smallest size class");

    /* control characters: anywhere but tab and the final CR of a line */
    expect_error("alloclens-config 1\nallocator /usr/lib/li\x01" "b.so\n", 2, "control character in the line");
    expect_error("alloclens-config 1\x0b\n", 1, "control character");
    expect_error("alloclens-config 1\n# a comment \x1b[31m red\n", 2, "control character");
    expect_error("alloclens-config 1\nstyle bibop\rpage_size 4096\n", 2, "control character");
    expect_error("alloclens-config 1\nstyle bibop\r\r\n", 2, "control character");
    expect_error(BASE "confidence \x7f ok but \x0c not\n", 8, "control character");
    expect_error_len("alloclens-config 1\nallocator /a\0/b\n", 35, 2, "control character");
    expect_error_len("alloclens-config 1\0\n", 20, 1, "control character");
}
END_TEST

START_TEST(parse_limits)
{
    /* the allocator path: at most AL_CONFIG_PATH_MAX - 1 bytes */
    size_t n = 0;
    n += (size_t)sprintf(text, "alloclens-config 1\nallocator /");
    memset(text + n, 'a', AL_CONFIG_PATH_MAX - 2);
    n += AL_CONFIG_PATH_MAX - 2;
    n += (size_t)sprintf(text + n, "\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\nlarge_threshold 9\nsize_classes 8\n");
    ck_assert_int_eq(parse(text, n), 0);
    ck_assert_uint_eq(strlen(cfg.allocator), AL_CONFIG_PATH_MAX - 1);
    n = (size_t)sprintf(text, "alloclens-config 1\n\nallocator /");
    memset(text + n, 'a', AL_CONFIG_PATH_MAX - 1);
    n += AL_CONFIG_PATH_MAX - 1;
    text[n++] = '\n';
    expect_error_len(text, n, 3, "allocator: path too long");

    /* AL_CONFIG_MAX_CLASSES classes, split over lines; one more is an error on its line */
    n = (size_t)sprintf(text, "alloclens-config 1\nallocator /l\nidentity 0 0 0 0\nstyle bibop\npage_size 4096\n"
                              "large_threshold %u\n",
                        AL_CONFIG_MAX_CLASSES * 8 + 1);
    for (unsigned i = 1; i <= AL_CONFIG_MAX_CLASSES; i++)
        n += (size_t)sprintf(text + n, "%s%u%s", i % 100 == 1 ? "size_classes " : "", i * 8, i % 100 == 0 ? "\n" : " ");
    text[n++] = '\n';
    ck_assert_int_eq(parse(text, n), 0);
    ck_assert_uint_eq(cfg.nclasses, AL_CONFIG_MAX_CLASSES);
    ck_assert_uint_eq(cfg.classes[AL_CONFIG_MAX_CLASSES - 1], AL_CONFIG_MAX_CLASSES * 8);
    unsigned lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += text[i] == '\n';
    n += (size_t)sprintf(text + n, "size_classes %u\n", AL_CONFIG_MAX_CLASSES * 8 + 8);
    expect_error_len(text, n, lines + 1, "more than 16384 classes");

    /* a long confidence is cut to 255 bytes, never with a blank at the end (it must read back) */
    n = (size_t)sprintf(text, BASE "confidence ");
    memset(text + n, 'c', 400);
    text[n + 254] = ' ';
    text[n + 253] = '\t';
    n += 400;
    ck_assert_int_eq(parse(text, n), 0);
    ck_assert_uint_eq(strlen(cfg.confidence), 253);
    n = (size_t)sprintf(text, BASE "confidence ");
    memset(text + n, 'c', 400);
    n += 400;
    ck_assert_int_eq(parse(text, n), 0);
    ck_assert_uint_eq(strlen(cfg.confidence), 255);
}
END_TEST

/* A run FIRST..LAST/STEP stands for its classes, among single ones, on any line. */
START_TEST(parse_class_runs)
{
    ck_assert_int_eq(parse_str(BASE_HEAD "large_threshold 97\nsize_classes 8 16..64/16 72\nsize_classes 80..96/8\n"), 0);
    static const uint64_t want[] = { 8, 16, 32, 48, 64, 72, 80, 88, 96 };
    ck_assert_uint_eq(cfg.nclasses, sizeof want / sizeof *want);
    for (unsigned i = 0; i < cfg.nclasses; i++)
        ck_assert_uint_eq(cfg.classes[i], want[i]);
    /* the same classes as runs, as the fields gave them */
    static const struct al_class_run runs[] = { { 8, 0, 1 }, { 16, 16, 4 }, { 72, 0, 1 }, { 80, 8, 3 } };
    ck_assert_uint_eq(cfg.nruns, 4);
    for (unsigned i = 0; i < cfg.nruns; i++)
        ck_assert(cfg.runs[i].first == runs[i].first && cfg.runs[i].step == runs[i].step &&
                  cfg.runs[i].count == runs[i].count);
    ck_assert_uint_eq(_al_config_last_class(&cfg), 96);
    /* single classes evenly spaced join into runs */
    ck_assert_int_eq(parse_str(BASE_HEAD "large_threshold 65\nsize_classes 8 16 24 32 48 64\n"), 0);
    ck_assert_uint_eq(cfg.nruns, 2);
    ck_assert(cfg.runs[0].first == 8 && cfg.runs[0].step == 8 && cfg.runs[0].count == 4);
    ck_assert(cfg.runs[1].first == 48 && cfg.runs[1].step == 16 && cfg.runs[1].count == 2);
    /* the largest run there may be: every class there is room for */
    char t[256];
    snprintf(t, sizeof t, BASE_HEAD "large_threshold 2\nsize_classes 1..%d/1\n", AL_CONFIG_MAX_CLASSES);
    ck_assert_int_eq(parse_str(t), 0);
    ck_assert_uint_eq(cfg.nclasses, AL_CONFIG_MAX_CLASSES);
    ck_assert_uint_eq(cfg.classes[AL_CONFIG_MAX_CLASSES - 1], AL_CONFIG_MAX_CLASSES);

    /* malformed runs, and runs against the rules for any class (all on line 7) */
    static const struct {
        const char *classes, *what;
    } bad[] = {
        { "8..64", "8..64: expected /STEP after a run" },
        { "8..64/0", "8..64/0: not a run" },
        { "64..8/8", "64..8/8: not a run" },
        { "8..8/8", "8..8/8: not a run" },
        { "8..60/16", "8..60/16: not a run" },
        { "8..", "size_classes: expected a decimal number" },
        { "8..64/8x", "'x' after a number" },
        { "8.64", "'.' after a number" },
        { "8 8..64/8", "8 is not above the class before it" },
        { "0..64/8", "a class of 0 bytes" },
        { "1..99999999999999999999/1", "number too large" },
    };
    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(t, sizeof t, BASE_HEAD "large_threshold 9\nsize_classes %s\n", bad[i].classes);
        expect_error(t, 7, bad[i].what);
    }
    snprintf(t, sizeof t, BASE_HEAD "large_threshold 2\nsize_classes 1..%d/1\n", AL_CONFIG_MAX_CLASSES + 1);
    expect_error(t, 7, "more than 16384 classes");
}
END_TEST

/* format -> parse -> same config, and the same text again. */
static void check_roundtrip(const struct al_alloc_config *c)
{
    long n = _al_config_format(c, text, sizeof text);
    ck_assert_int_gt(n, 0);
    ck_assert_uint_eq(strlen(text), (size_t)n);
    int r = _al_config_parse(text, (size_t)n, "fmt", &cfg2, err, sizeof err);
    ck_assert_msg(r == 0, "formatted text does not parse: %s\n%.300s", err, text);
    ck_assert(same_config(c, &cfg2));
    long m = _al_config_format(&cfg2, text2, sizeof text2);
    ck_assert_int_eq(m, n);
    ck_assert_mem_eq(text, text2, (size_t)n);
    /* every buffer too small is -ENOSPC, and nothing is written past it */
    for (size_t cap = 0; cap <= (size_t)n; cap += cap < 200 ? 1 : (size_t)n / 50 + 1) {
        memset(text2, 'Z', (size_t)n + 2);
        ck_assert_int_eq(_al_config_format(c, text2, cap), -ENOSPC);
        ck_assert_int_eq(text2[cap], 'Z');
    }
    ck_assert_int_eq(_al_config_format(c, text2, (size_t)n), -ENOSPC);
    ck_assert_int_eq(_al_config_format(c, text2, (size_t)n + 1), n);
}

static void fill_classes(struct al_alloc_config *c, uint64_t first, uint64_t step, uint64_t last)
{
    c->nclasses = 0;
    for (uint64_t v = first; v <= last; v += step)
        c->classes[c->nclasses++] = v;
}

START_TEST(format_roundtrip)
{
    /* parsed text */
    ck_assert_int_eq(parse_str(BASE "confidence high\n"), 0);
    static struct al_alloc_config c;
    c = cfg;
    check_roundtrip(&c);
    ck_assert_int_eq(parse_str(BASE), 0);
    c = cfg;
    check_roundtrip(&c);

    /* as the probe would fill it: glibc-like, 8190 classes over many size_classes lines */
    memset(&c, 0, sizeof c);
    strcpy(c.allocator, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    c.identity = (struct al_file_identity){ 64769, 3932211, 1922136, 1700000000123456789 };
    c.style = AL_STYLE_SEQUENTIAL;
    c.page_size = 4096;
    c.large_threshold = 131049;
    fill_classes(&c, 24, 16, 131048);
    strcpy(c.confidence, "every boundary seen in 3 of 3 runs");
    check_roundtrip(&c);
    ck_assert_msg(strstr(text, "\nsize_classes 24..131048/16\n") != NULL, "not one run:\n%.600s", text);

    /* runs of 32 evenly spaced classes or more are written as runs, shorter ones class by class */
    uint32_t n = 0;
    for (uint64_t v = 8; v <= 128; v += 8) /* 16 classes */
        c.classes[n++] = v;
    for (uint64_t v = 200; v <= 200 + 31 * 32; v += 32) /* 32 */
        c.classes[n++] = v;
    c.classes[n++] = 4096;
    c.nclasses = n;
    c.large_threshold = 4097;
    check_roundtrip(&c);
    ck_assert_msg(strstr(text, "\nsize_classes 8 16 24 32 40 48 56 64 72 80 88 96 104 112 120 128\n"
                               "size_classes 200..1192/32 4096\n") != NULL, "runs:\n%.600s", text);

    /* the extremes: every class, the largest numbers, a file from before 1970, no confidence */
    memset(&c, 0, sizeof c);
    memset(c.allocator, 'p', sizeof c.allocator - 1);
    c.allocator[0] = '/';
    c.identity = (struct al_file_identity){ INT64_MAX, 0, INT64_MAX, -1 };
    c.page_size = 1ull << 30;
    fill_classes(&c, 1, 1, AL_CONFIG_MAX_CLASSES);
    c.classes[AL_CONFIG_MAX_CLASSES - 1] = INT64_MAX;
    c.large_threshold = 1ull << 40;
    check_roundtrip(&c);
    c.identity.mtime_ns = -INT64_MAX;
    check_roundtrip(&c);

    /* a confidence of the most bytes the struct holds */
    memset(c.confidence, 'x', sizeof c.confidence - 1);
    c.confidence[sizeof c.confidence - 1] = '\0';
    c.nclasses = 1;
    c.large_threshold = 2;
    check_roundtrip(&c);

    /* the written text says what it is */
    ck_assert_int_gt(_al_config_format(&c, text, sizeof text), 0);
    ck_assert(strncmp(text, "alloclens-config 1\n", 19) == 0);
    ck_assert_str_eq(_al_config_style_name(AL_STYLE_BIBOP), "bibop");
    ck_assert_str_eq(_al_config_style_name(AL_STYLE_SEQUENTIAL), "sequential");
}
END_TEST

static char tmpdir[64];

/* Writes a file in tmpdir; its path lives as long as the test (one slot per name). */
static const char *write_tmp(const char *name, const char *content, size_t len)
{
    static char paths[8][256];
    static unsigned used;
    char *path = NULL;
    for (unsigned i = 0; i < used && !path; i++)
        if (strcmp(strrchr(paths[i], '/') + 1, name) == 0)
            path = paths[i];
    if (!path) {
        ck_assert_uint_lt(used, 8);
        path = paths[used++];
    }
    snprintf(path, sizeof paths[0], "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(content, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

START_TEST(load_files)
{
    strcpy(tmpdir, "/tmp/alloclens-test-config-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char path[256];

    /* missing file */
    snprintf(path, sizeof path, "%s/none.conf", tmpdir);
    cfg.nclasses = 7;
    int r = _al_config_load(path, &cfg, err, sizeof err);
    ck_assert_int_eq(r, -ENOENT);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0 && strstr(err, ": cannot read: No such file") != NULL,
                  "%s", err);

    /* a directory */
    r = _al_config_load(tmpdir, &cfg, err, sizeof err);
    ck_assert_int_lt(r, 0);
    ck_assert_msg(strncmp(err, tmpdir, strlen(tmpdir)) == 0 && strstr(err, ": cannot read: not a regular file") != NULL,
                  "%s", err);

    /* a good file */
    const char *good = write_tmp("good.conf", BASE "confidence file\n", strlen(BASE "confidence file\n"));
    ck_assert_int_eq(_al_config_load(good, &cfg, err, sizeof err), 0);
    ck_assert_uint_eq(cfg.nclasses, 3);
    ck_assert_str_eq(cfg.confidence, "file");

    /* loaded as runs alone: classes[] not written until expanded, then as a whole load */
    const char *glibc = "alloclens-config 1\nallocator /usr/lib/libc.so.6\nidentity 1 2 3 4\nstyle sequential\n"
                        "page_size 4096\nlarge_threshold 131049\nsize_classes 24..131048/16\n";
    const char *runs = write_tmp("runs.conf", glibc, strlen(glibc));
    static struct al_alloc_config lazy;
    memset(&lazy, 0, sizeof lazy);
    ck_assert_int_eq(_al_config_load_runs(runs, &lazy, err, sizeof err), 0);
    ck_assert(lazy.runs_only);
    ck_assert_uint_eq(lazy.nclasses, 8190);
    ck_assert_uint_eq(lazy.nruns, 1);
    ck_assert_uint_eq(_al_config_last_class(&lazy), 131048);
    for (unsigned i = 0; i < AL_CONFIG_MAX_CLASSES; i++)
        ck_assert_uint_eq(lazy.classes[i], 0);
    _al_config_expand(&lazy);
    ck_assert(!lazy.runs_only);
    ck_assert_int_eq(_al_config_load(runs, &cfg, err, sizeof err), 0);
    ck_assert(!cfg.runs_only);
    ck_assert_uint_eq(cfg.nclasses, 8190);
    ck_assert_mem_eq(lazy.classes, cfg.classes, 8190 * sizeof cfg.classes[0]);

    /* a broken one: FILE:LINE, nothing kept */
    const char *bad = write_tmp("bad.conf", BASE "page_size 8192\n", strlen(BASE "page_size 8192\n"));
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s:8: page_size given twice", bad);
    ck_assert_int_eq(_al_config_load(bad, &cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, prefix);
    ck_assert_uint_eq(cfg.nclasses, 0);

    /* an empty file */
    const char *empty = write_tmp("empty.conf", "", 0);
    ck_assert_int_eq(_al_config_load(empty, &cfg, err, sizeof err), -EINVAL);
    ck_assert(strstr(err, ":1: empty file") != NULL);

    /* unreadable (when not root) */
    const char *locked = write_tmp("locked.conf", BASE, strlen(BASE));
    chmod(locked, 0);
    if (geteuid() != 0) {
        ck_assert_int_eq(_al_config_load(locked, &cfg, err, sizeof err), -EACCES);
        ck_assert(strstr(err, ": cannot read: Permission denied") != NULL);
    }

    /* a small error buffer is cut, not overrun */
    char tiny[12];
    memset(tiny, 'Z', sizeof tiny);
    ck_assert_int_eq(_al_config_load(bad, &cfg, tiny, 8), -EINVAL);
    ck_assert_uint_eq(strlen(tiny), 7);
    ck_assert_int_eq(tiny[8], 'Z');
    ck_assert_int_eq(_al_config_parse("x", 1, "a-rather-long-name.conf", &cfg, tiny, 8), -EINVAL);
    ck_assert_uint_eq(strlen(tiny), 7);
    ck_assert_int_eq(_al_config_parse("x", 1, "n", &cfg, NULL, 0), -EINVAL);

    /* identity follows the file */
    struct al_file_identity id1, id2;
    ck_assert_int_eq(_al_config_identity(good, &id1), 0);
    ck_assert_int_eq(_al_config_identity(good, &id2), 0);
    ck_assert(_al_config_identity_equal(&id1, &id2));
    ck_assert_uint_eq(id1.size, strlen(BASE "confidence file\n"));
    write_tmp("good.conf", BASE, strlen(BASE));
    ck_assert_int_eq(_al_config_identity(good, &id2), 0);
    ck_assert(!_al_config_identity_equal(&id1, &id2));
    ck_assert_int_eq(_al_config_identity(path, &id2), -ENOENT);

    const char *names[] = { "good.conf", "runs.conf", "bad.conf", "empty.conf", "locked.conf" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
}
END_TEST

/* ---- size -> class ---------------------------------------------------------------------------- */

/* Checks _al_class_of against "smallest class >= size" for every size from 0 to threshold + 100
 * (and a few far above); returns the table's size. */
static size_t check_every_size(const struct al_alloc_config *c)
{
    size_t bytes = _al_class_table_bytes(c);
    if (_al_class_table_one_run(c))
        ck_assert_uint_eq(bytes, 0); /* worked out: no tables */
    else
        ck_assert_uint_gt(bytes, 0);
    ck_assert_msg(bytes < (1u << 20), "table of %zu bytes", bytes);
    void *mem = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(mem);
    struct al_class_table t;
    ck_assert_int_eq(_al_class_table_build(&t, c, mem), 0);
    uint32_t k = 0; /* the brute force: first class >= size */
    for (uint64_t size = 0; size <= c->large_threshold + 100; size++) {
        while (k < c->nclasses && c->classes[k] < size)
            k++;
        uint64_t want = size >= c->large_threshold ? 0 : c->classes[k];
        uint64_t got = _al_class_of(&t, size);
        if (got != want)
            ck_abort_msg("threshold %llu: class of %llu is %llu, should be %llu", (unsigned long long)c->large_threshold,
                         (unsigned long long)size, (unsigned long long)got, (unsigned long long)want);
    }
    ck_assert_uint_eq(_al_class_of(&t, UINT64_MAX), 0);
    ck_assert_uint_eq(_al_class_of(&t, 1ull << 62), 0);
    free(mem);
    return bytes;
}

static void config_of(struct al_alloc_config *c, uint64_t threshold)
{
    memset(c, 0, offsetof(struct al_alloc_config, classes));
    strcpy(c->allocator, "/l");
    c->page_size = 4096;
    c->large_threshold = threshold;
}

static struct al_alloc_config lc;

START_TEST(lookup_glibc)
{
    config_of(&lc, 131049);
    fill_classes(&lc, 24, 16, 131048);
    size_t bytes = check_every_size(&lc);
    ck_assert_uint_le(bytes, 70000); /* granules of 8 bytes: ~16 Ki entries */
    /* a lower mmap threshold: the last class covers it */
    lc.large_threshold = 1000;
    check_every_size(&lc);
    lc.large_threshold = 65536;
    check_every_size(&lc);
    lc.large_threshold = 65537;
    check_every_size(&lc);
    lc.large_threshold = 70001; /* the table's last granule reaches past the threshold */
    check_every_size(&lc);
}
END_TEST

START_TEST(lookup_jemalloc)
{
    /* 8, 16, then four classes per doubling */
    config_of(&lc, 14337);
    lc.nclasses = 0;
    uint64_t je[] = { 8, 16, 32, 48, 64, 80, 96, 112, 128 };
    for (size_t i = 0; i < 9; i++)
        lc.classes[lc.nclasses++] = je[i];
    for (uint64_t base = 128; lc.classes[lc.nclasses - 1] < 14336; base *= 2)
        for (int i = 1; i <= 4; i++)
            lc.classes[lc.nclasses++] = base + (uint64_t)i * base / 4;
    ck_assert_uint_eq(lc.classes[lc.nclasses - 1], 16384);
    lc.nclasses--; /* ends at 14336 */
    ck_assert_uint_eq(lc.classes[lc.nclasses - 1], 14336);
    ck_assert_uint_le(check_every_size(&lc), 8192);
    /* the same classes past 64 KiB (jemalloc's large classes up to 4 MiB are spaced alike) */
    for (uint64_t base = 16384; base < (1u << 20); base *= 2)
        for (int i = 1; i <= 4; i++)
            if (base + (uint64_t)i * base / 4 > lc.classes[lc.nclasses - 1])
                lc.classes[lc.nclasses++] = base + (uint64_t)i * base / 4;
    lc.large_threshold = (1u << 20) + 1;
    ck_assert_uint_le(check_every_size(&lc), 1u << 20);
}
END_TEST

START_TEST(lookup_beyond_64k)
{
    /* coarse classes above 64 KiB: 65536, 73728, ... 262144 every 8 KiB */
    config_of(&lc, 262145);
    fill_classes(&lc, 1024, 1024, 65536);
    for (uint64_t v = 73728; v <= 262144; v += 8192)
        lc.classes[lc.nclasses++] = v;
    ck_assert_uint_le(check_every_size(&lc), 4096);
    /* thresholds inside the coarse range, on and off a granule */
    lc.large_threshold = 73729;
    check_every_size(&lc);
    lc.large_threshold = 100000;
    check_every_size(&lc);
    lc.large_threshold = 65537;
    check_every_size(&lc);
    /* an uneven class just above the split: one-byte granules there */
    config_of(&lc, 70001);
    lc.nclasses = 0;
    uint64_t odd[] = { 16, 65535, 65536, 65537, 65539, 70000 };
    for (size_t i = 0; i < 6; i++)
        lc.classes[lc.nclasses++] = odd[i];
    check_every_size(&lc);
}
END_TEST

START_TEST(lookup_odd)
{
    config_of(&lc, 2993);
    lc.nclasses = 0;
    uint64_t odd[] = { 24, 72, 200, 1000, 2992 };
    for (size_t i = 0; i < 5; i++)
        lc.classes[lc.nclasses++] = odd[i];
    ck_assert_uint_le(check_every_size(&lc), 2993 * 4);
    lc.large_threshold = 25; /* the smallest the parser allows */
    check_every_size(&lc);
    lc.large_threshold = 1500;
    check_every_size(&lc);

    /* one class; classes of 1 byte; classes well past the threshold */
    config_of(&lc, 2);
    lc.nclasses = 1;
    lc.classes[0] = 1;
    check_every_size(&lc);
    config_of(&lc, 1025);
    fill_classes(&lc, 1, 1, 1024);
    check_every_size(&lc);
    config_of(&lc, 33);
    lc.nclasses = 0;
    uint64_t far[] = { 16, 32, 48, 100000, 1ull << 40 };
    for (size_t i = 0; i < 5; i++)
        lc.classes[lc.nclasses++] = far[i];
    check_every_size(&lc);
    lc.large_threshold = 41; /* the last granule spans 48 and more */
    check_every_size(&lc);
    lc.large_threshold = 90000; /* classes above the threshold must not be chosen below it */
    check_every_size(&lc);
}
END_TEST

START_TEST(lookup_small_threshold)
{
    /* thresholds at or below 64 KiB: only the low table */
    config_of(&lc, 513);
    fill_classes(&lc, 16, 16, 512);
    ck_assert_uint_le(check_every_size(&lc), 512);
    config_of(&lc, 65536);
    fill_classes(&lc, 4096, 4096, 65536);
    check_every_size(&lc);
    lc.large_threshold = 65537;
    check_every_size(&lc);
    lc.large_threshold = 40000;
    check_every_size(&lc);
    /* one-byte granules all the way to 64 KiB: the largest low table */
    config_of(&lc, 65536);
    fill_classes(&lc, 1, 1, 4096);
    for (uint64_t v = 4103; v < 65535; v += 8)
        lc.classes[lc.nclasses++] = v;
    lc.classes[lc.nclasses++] = 65535;
    ck_assert_uint_le(lc.nclasses, AL_CONFIG_MAX_CLASSES);
    ck_assert_uint_eq(check_every_size(&lc), 65535 * 4);
}
END_TEST

/* Classes that are one run with a power-of-two step are worked out, no tables, no class list:
 * glibc's, one class, and a run whose start is no multiple of its step; a run of another step,
 * or two runs, take the tables. Every size checked against the classes the parser listed. */
START_TEST(lookup_one_run)
{
    static const struct {
        const char *text;
        bool one_run;
    } cases[] = {
        { BASE_HEAD "large_threshold 131049\nsize_classes 24..131048/16\n", true },
        { BASE_HEAD "large_threshold 4097\nsize_classes 4096\n", true },
        { BASE_HEAD "large_threshold 1001\nsize_classes 40..1064/64\n", true },
        { BASE_HEAD "large_threshold 1001\nsize_classes 24..1008/24\n", false },
        { BASE_HEAD "large_threshold 1001\nsize_classes 16..512/16 1024\n", false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ck_assert_msg(parse_str(cases[i].text) == 0, "case %zu: %s", i, err);
        ck_assert_msg(_al_class_table_one_run(&cfg) == cases[i].one_run, "case %zu", i);
        check_every_size(&cfg);
    }
    /* Loaded as runs alone (classes[] not filled), one run builds all the same. */
    ck_assert_int_eq(parse_str(cases[0].text), 0);
    memset(cfg.classes, 0, sizeof cfg.classes);
    struct al_class_table t;
    ck_assert_int_eq(_al_class_table_build(&t, &cfg, NULL), 0);
    ck_assert_uint_eq(_al_class_of(&t, 1), 24);
    ck_assert_uint_eq(_al_class_of(&t, 25), 40);
    ck_assert_uint_eq(_al_class_of(&t, 131048), 131048);
    ck_assert_uint_eq(_al_class_of(&t, 131049), 0);
    ck_assert_uint_eq(_al_class_index(&t, 131048), 8189);
    /* A run that stops short of the threshold is refused as a table would be. */
    ck_assert_int_eq(parse_str(BASE_HEAD "large_threshold 131049\nsize_classes 24..131048/16\n"), 0);
    cfg.large_threshold = 131050;
    ck_assert_int_eq(_al_class_table_build(&t, &cfg, NULL), -EINVAL);
}
END_TEST

START_TEST(lookup_limits)
{
    /* Built from parsed text: the table works on what the parser gives. */
    ck_assert_int_eq(parse_str(BASE), 0);
    check_every_size(&cfg);

    /* Refused, not crashed: an invalid config, and one needing more than 4 Mi granules above
     * 64 KiB (a huge threshold with no class boundary to coarsen the granules). */
    struct al_class_table t;
    config_of(&lc, 1000);
    lc.nclasses = 0;
    ck_assert_uint_eq(_al_class_table_bytes(&lc), 0);
    ck_assert_int_eq(_al_class_table_build(&t, &lc, NULL), -EINVAL);
    lc.nclasses = 1;
    lc.classes[0] = 100;
    ck_assert_int_eq(_al_class_table_build(&t, &lc, NULL), -EINVAL);
    config_of(&lc, 1ull << 40);
    lc.nclasses = 2;
    lc.classes[0] = 16;
    lc.classes[1] = (1ull << 40) + 5;
    size_t bytes = _al_class_table_bytes(&lc);
    ck_assert_uint_gt(bytes, 1u << 22);
    ck_assert_uint_lt(bytes, 1u << 25);
    void *mem = malloc(bytes);
    ck_assert_int_eq(_al_class_table_build(&t, &lc, mem), -EINVAL);
    free(mem);
    /* the same threshold with 64 KiB spacing up to 2^38 fits */
    config_of(&lc, 1ull << 38);
    lc.nclasses = 2;
    lc.classes[0] = 16;
    lc.classes[1] = 1ull << 38;
    bytes = _al_class_table_bytes(&lc);
    ck_assert_uint_le(bytes, 17u << 20);
    mem = malloc(bytes);
    ck_assert_int_eq(_al_class_table_build(&t, &lc, mem), 0);
    ck_assert_uint_eq(_al_class_of(&t, 0), 16);
    ck_assert_uint_eq(_al_class_of(&t, 17), 1ull << 38);
    ck_assert_uint_eq(_al_class_of(&t, (1ull << 38) - 1), 1ull << 38);
    ck_assert_uint_eq(_al_class_of(&t, 1ull << 38), 0);
    free(mem);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, parse_valid_base);
    tcase_add_test(tc, parse_layout_accepted);
    tcase_add_test(tc, parse_errors_lines);
    tcase_add_test(tc, parse_limits);
    tcase_add_test(tc, parse_class_runs);
    tcase_add_test(tc, format_roundtrip);
    tcase_add_test(tc, load_files);
    tcase_add_test(tc, lookup_glibc);
    tcase_add_test(tc, lookup_jemalloc);
    tcase_add_test(tc, lookup_beyond_64k);
    tcase_add_test(tc, lookup_odd);
    tcase_add_test(tc, lookup_small_threshold);
    tcase_add_test(tc, lookup_one_run);
    tcase_add_test(tc, lookup_limits);
    suite_add_tcase(s, tc);
    return al_check_run(s);
}
