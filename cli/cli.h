/* cli/ internal API: the subcommands of the alloclens command and what they share. */
#ifndef ALLOCLENS_CLI_H
#define ALLOCLENS_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct al_found_allocator {
    const char *name;
    char path[PATH_MAX];
    char version[64];
};

#define AL_MAX_ALLOCATORS 4

/* Where the loader splits LD_PRELOAD: a library whose path holds one cannot be preloaded. */
#define AL_PRELOAD_SEPARATORS " :"

/* allocators.c: the allocators installed on this machine, in a fixed order. */
int _al_cli_find_allocators(struct al_found_allocator *out, int cap);
/* Resolves -a's argument (a name or a path); 0, or prints one error line and returns -1. */
int _al_cli_resolve_allocator(const char *arg, struct al_found_allocator *ret);
int _al_cli_cmd_allocators(int argc, char **argv);

/* run.c */
int _al_cli_cmd_run(int argc, char **argv);
int _al_cli_cmd_options(int argc, char **argv);

/* compare.c: compare, and demo (the bundled workload compared under every allocator) */
int _al_cli_cmd_compare(int argc, char **argv);
int _al_cli_cmd_demo(int argc, char **argv);

/* report.c */
int _al_cli_cmd_report(int argc, char **argv);

/* report_read.c: a saved report's fields (NULL, NAN, "" or 0 where it has none), and bytes as
 * both commands write them ("-" for none). */
struct json_object;
struct json_object *_al_cli_get(struct json_object *o, const char *key);
double _al_cli_num(struct json_object *o, const char *key);
const char *_al_cli_str(struct json_object *o, const char *key);
/* V as text: a string's own, any other value as its JSON, "" for none. */
const char *_al_cli_text(struct json_object *v);
size_t _al_cli_len(struct json_object *array);
bool _al_cli_available(struct json_object *section);
void _al_cli_bytes(char *out, size_t cap, double v);
/* The JSON in the file PATH ('-': stdin), read strictly (RFC 8259: nothing before or after
 * the value, no comments, NaN or single quotes), or NULL with why not in ERR (CAP bytes). */
struct json_object *_al_cli_read_json(const char *path, char *err, size_t cap);
/* The schema profiler/report_json.c writes (docs/report-schema.md): the one a report must name. */
#define AL_REPORT_SCHEMA "alloclens-report/1"
/* _al_cli_read_json, for a JSON object whose "schema" is AL_REPORT_SCHEMA. */
struct json_object *_al_cli_read_report(const char *path, char *err, size_t cap);

/* json_strict.c: the offset of the first thing in TEXT (N bytes) that strict JSON forbids and
 * json-c's strict mode takes (NaN, a single quote, a control character in a string...), with
 * what it is in WHAT (CAP bytes); N when there is none. */
size_t _al_cli_json_unstrict(const char *text, size_t n, char *what, size_t cap);

/* prerun.c */
int _al_cli_cmd_prerun(int argc, char **argv);
/* The config file for a run under ALLOC: given, cached or freshly probed. */
int _al_cli_config_for_run(const struct al_found_allocator *alloc, char *path, size_t cap);

/* main.c: this command's own path, and files installed beside it (build tree or install
 * tree); 0 or -1. */
int _al_cli_self_exe(char *out, size_t cap);
int _al_cli_sibling(const char *build_rel, const char *install_name, char *out, size_t cap);
/* Whether PATH (SHOWN in the message) can be written: 0, or one line naming WHAT ("the
 * report") and -1. A file it had to create is removed again. */
int _al_cli_check_writable(const char *path, const char *shown, const char *what);
/* 0, or one line and -1 where the VALUE that follows option OPT is "--" or, by IS_OPTION, one
 * of the command's own options: OPT's value was left out, and taking the next word for it
 * would write a file named '--' or run the value of the option after. */
int _al_cli_value_given(const char *opt, const char *value, bool is_option);
/* 0 where option OPT had no value BEFORE (NULL); else one line saying it was given twice and
 * -1: every option takes one value, and a later one silently taking the place of the first
 * would lose what was asked. */
int _al_cli_once(const char *opt, const char *before, const char *value);
/* S in OUT (CAP bytes, cut short where full, NUL-terminated) with its control characters
 * written as C escapes (_al_escape_controls, as the library's messages have them), so that a
 * message showing a value stays one line; OUT. */
const char *_al_cli_escaped(const char *s, char *out, size_t cap);
/* 0 when MODE names a mode (full, time, sample), else -1 after one line saying it does not. */
int _al_cli_check_mode(const char *mode);

#endif
