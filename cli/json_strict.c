/* What json-c's strict mode (JSON_TOKENER_STRICT, json-c 0.16) still takes that JSON (RFC
 * 8259) does not: a single-quoted object key, NaN, Infinity and -Infinity, a number ending in
 * '.', control characters inside a string. A saved report is written by us as strict JSON, so
 * any of these means the file came from somewhere else or was edited by hand: it is refused
 * with the place, rather than rendered from what a lenient reading made of it. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static bool digit(char c)
{
    return c >= '0' && c <= '9';
}

/* A bare word: a letter, digit or one of "+-." (what a literal or a number is made of). */
static bool word_char(char c)
{
    return digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '+' || c == '-' || c == '.';
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool json_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && digit(s[i]))
        while (i < n && digit(s[i]))
            i++;
    else
        return false;
    if (i < n && s[i] == '.') {
        if (++i >= n || !digit(s[i]))
            return false;
        while (i < n && digit(s[i]))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || !digit(s[i]))
            return false;
        while (i < n && digit(s[i]))
            i++;
    }
    return i == n;
}

static bool json_word(const char *s, size_t n)
{
    return (n == 4 && !memcmp(s, "true", 4)) || (n == 5 && !memcmp(s, "false", 5)) ||
           (n == 4 && !memcmp(s, "null", 4)) || json_number(s, n);
}

size_t _al_cli_json_unstrict(const char *s, size_t n, char *what, size_t cap)
{
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped character is json-c's to check */
            else if (c == '"')
                in_string = false;
            else if (c < 0x20) {
                snprintf(what, cap, "a control character (0x%02x) inside a string", c);
                return i;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '\'') {
            snprintf(what, cap, "a single quote (JSON strings take double quotes)");
            return i;
        } else if (word_char((char)c)) {
            size_t j = i;
            while (j < n && word_char(s[j]))
                j++;
            if (!json_word(s + i, j - i)) {
                snprintf(what, cap, "'%.*s%s' is not a JSON value", (int)(j - i > 24 ? 24 : j - i), s + i,
                         j - i > 24 ? "..." : "");
                return i;
            }
            i = j - 1;
        }
    }
    return n;
}
