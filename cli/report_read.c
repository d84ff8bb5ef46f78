/* Reading saved JSON reports back (compare, report): field access that takes what a report
 * lacks (an absent field, a JSON null, a section of an older schema) as "no figure", and the
 * one way both commands write a byte count. */
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

void _al_cli_json_error(char *out, size_t cap)
{
    const char *e = json_util_get_last_err();
    snprintf(out, cap, "%.*s", e ? (int)strcspn(e, "\n") : 0, e ? e : "");
}
