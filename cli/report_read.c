/* Reading saved JSON reports back (compare, report): field access that takes what a report
 * lacks (an absent field, a JSON null, a section of an older schema) as "no figure", and the
 * one way both commands write a byte count. */
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
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

json_object *_al_cli_read_json(const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "%s", strerror(errno));
        return NULL;
    }
    json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    json_object *r = NULL;
    enum json_tokener_error e = json_tokener_continue;
    char buf[65536];
    size_t n;
    while (tok && e == json_tokener_continue && (n = fread(buf, 1, sizeof buf, f)) > 0) {
        r = json_tokener_parse_ex(tok, buf, (int)n);
        e = json_tokener_get_error(tok);
    }
    if (!tok)
        snprintf(err, cap, "%s", strerror(ENOMEM));
    else if (ferror(f))
        snprintf(err, cap, "%s", strerror(errno ? errno : EIO));
    else if (e == json_tokener_continue)
        snprintf(err, cap, "the file ends before its JSON does (empty or cut short)");
    else if (e != json_tokener_success)
        snprintf(err, cap, "not JSON: %s at byte %zu", json_tokener_error_desc(e),
                 json_tokener_get_parse_end(tok));
    if (!tok || ferror(f) || e != json_tokener_success) {
        json_object_put(r);
        r = NULL;
    }
    json_tokener_free(tok);
    fclose(f);
    return r;
}
