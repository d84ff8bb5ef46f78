/* Reading saved JSON reports back (compare, report): field access that takes what a report
 * lacks (an absent field, a JSON null, a section of an older schema) as "no figure", and the
 * one way both commands write a byte count. */
#include <errno.h>
#include <limits.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

json_object *_al_cli_get(json_object *o, const char *key)
{
    json_object *v = NULL;
    return o && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

double _al_cli_num(json_object *o, const char *key)
{
    json_object *v = _al_cli_get(o, key);
    return v ? json_object_get_double(v) : NAN;
}

const char *_al_cli_str(json_object *o, const char *key)
{
    json_object *v = _al_cli_get(o, key);
    return v && json_object_get_type(v) == json_type_string ? json_object_get_string(v) : "";
}

const char *_al_cli_text(json_object *v)
{
    const char *s = v ? json_object_get_string(v) : NULL;
    return s ? s : "";
}

size_t _al_cli_len(json_object *a)
{
    return a && json_object_get_type(a) == json_type_array ? json_object_array_length(a) : 0;
}

bool _al_cli_available(json_object *section)
{
    return section && json_object_get_boolean(_al_cli_get(section, "available"));
}

void _al_cli_bytes(char *out, size_t cap, double v)
{
    double a = fabs(v);
    if (isnan(v))
        snprintf(out, cap, "-");
    else if (a >= 1024.0 * 1024 * 1024)
        snprintf(out, cap, "%.2f GiB", v / (1024.0 * 1024 * 1024));
    else if (a >= 1024.0 * 1024)
        snprintf(out, cap, "%.2f MiB", v / (1024.0 * 1024));
    else if (a >= 1024)
        snprintf(out, cap, "%.1f KiB", v / 1024);
    else
        snprintf(out, cap, "%.0f B", v);
}

/* All of F into a buffer of ours (*LEN bytes, NUL after them), or NULL with errno set. */
static char *slurp(FILE *f, size_t *len)
{
    size_t n = 0, cap = 65536;
    char *text = malloc(cap);
    while (text) {
        n += fread(text + n, 1, cap - n - 1, f);
        if (ferror(f) || feof(f))
            break;
        char *more = cap < SIZE_MAX / 2 ? realloc(text, cap * 2) : NULL;
        if (!more) {
            free(text);
            errno = ENOMEM;
            return NULL;
        }
        text = more;
        cap *= 2;
    }
    if (!text || ferror(f)) {
        int e = text ? (errno ? errno : EIO) : ENOMEM;
        free(text);
        errno = e;
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}

static bool json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* TEXT (LEN bytes) as strict JSON: one value, whitespace around it and nothing else. The
 * whole text goes to json-c at once, so the offsets it gives are the file's own. */
static json_object *parse_strict(const char *text, size_t len, char *err, size_t cap)
{
    if (len > INT_MAX) {
        snprintf(err, cap, "too large to be a report (%zu bytes)", len);
        return NULL;
    }
    json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!tok) {
        snprintf(err, cap, "%s", strerror(ENOMEM));
        return NULL;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *r = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    if (e == json_tokener_continue) {
        /* The input's end, told: it ends a top-level number, and anything else there is cut
         * short. */
        r = json_tokener_parse_ex(tok, "", 1);
        e = json_tokener_get_error(tok);
        if (e != json_tokener_success)
            e = json_tokener_continue;
        end = len;
    }
    json_tokener_free(tok);
    if (e == json_tokener_success)
        while (end < len && json_space(text[end]))
            end++;
    /* The first problem is the one said: json-c's, or one that its strict mode lets by. */
    char what[96];
    size_t odd = _al_cli_json_unstrict(text, len, what, sizeof what);
    if (odd < len && odd <= end)
        snprintf(err, cap, "not JSON: %s at byte %zu", what, odd);
    else if (e == json_tokener_continue)
        snprintf(err, cap, "the file ends before its JSON does (empty or cut short)");
    else if (e != json_tokener_success)
        snprintf(err, cap, "not JSON: %s at byte %zu", json_tokener_error_desc(e), end);
    else if (end < len)
        snprintf(err, cap, "not JSON: more after the value, at byte %zu", end);
    else
        return r;
    json_object_put(r);
    return NULL;
}

json_object *_al_cli_read_json(const char *path, char *err, size_t cap)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "re") : stdin;
    if (!f) {
        snprintf(err, cap, "%s", strerror(errno));
        return NULL;
    }
    size_t len;
    char *text = slurp(f, &len);
    if (!text)
        snprintf(err, cap, "%s", strerror(errno));
    if (f != stdin)
        fclose(f);
    json_object *r = text ? parse_strict(text, len, err, cap) : NULL;
    free(text);
    return r;
}

json_object *_al_cli_read_report(const char *path, char *err, size_t cap)
{
    json_object *r = _al_cli_read_json(path, err, cap);
    if (!r)
        return NULL;
    json_object *schema = NULL;
    bool named = json_object_object_get_ex(r, "schema", &schema); /* a JSON null is named */
    if (json_object_get_type(r) != json_type_object)
        snprintf(err, cap, "not an alloclens report: the JSON is not an object");
    else if (!named)
        snprintf(err, cap, "not an alloclens report: it has no \"schema\" field (this version reads "
                 "\"%s\")", AL_REPORT_SCHEMA);
    else if (json_object_get_type(schema) != json_type_string ||
             strcmp(json_object_get_string(schema), AL_REPORT_SCHEMA))
        snprintf(err, cap, "not an alloclens report of this version: its schema is %s, this version "
                 "reads \"%s\"", json_object_to_json_string_ext(schema, JSON_C_TO_STRING_PLAIN |
                 JSON_C_TO_STRING_NOSLASHESCAPE), AL_REPORT_SCHEMA);
    else
        return r;
    json_object_put(r);
    return NULL;
}
