/* Text made safe to show: control characters as C escapes, UTF-8 told from stray bytes, and a
 * command line's arguments as shell words. Shared by the library and the CLI (the options
 * library, which both link): their messages and their renderings of a report alike. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "profiler.h"

size_t _al_escape_controls(const char *text, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        char esc[5];
        size_t n;
        if (c == '\n' || c == '\t' || c == '\r')
            n = (size_t)snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
        else if (c < 0x20 || c == 0x7f)
            n = (size_t)snprintf(esc, sizeof esc, "\\x%02x", c);
        else {
            esc[0] = (char)c;
            n = 1;
        }
        if (o + n > cap)
            break;
        memcpy(out + o, esc, n);
        o += n;
    }
    return o;
}

size_t _al_utf8_len(const unsigned char *p)
{
    size_t n;
    uint32_t cp, min;
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        n = 2, cp = p[0] & 0x1f, min = 0x80;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        n = 3, cp = p[0] & 0x0f, min = 0x800;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        n = 4, cp = p[0] & 0x07, min = 0x10000;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) /* the string's NUL included */
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : n;
}

/* Bytes a shell takes as they are, outside quotes. */
static bool shell_plain(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("@%+=:,./_-", c));
}

void _al_shell_word(const char *s, size_t n, void (*put)(void *ctx, const char *p, size_t n), void *ctx)
{
    const unsigned char *p = (const unsigned char *)s;
    bool plain = n > 0;
    for (size_t i = 0, u; i < n && plain; i += u ? u : 1) {
        u = p[i] >= 0x80 ? _al_utf8_len(p + i) : 0;
        plain = shell_plain(p[i]) || u;
    }
    if (plain) {
        put(ctx, s, n);
        return;
    }
    put(ctx, "$'", 2);
    for (size_t i = 0; i < n; i++) {
        size_t u = p[i] >= 0x80 ? _al_utf8_len(p + i) : 0;
        char esc[8];
        if (u) {
            put(ctx, s + i, u);
            i += u - 1;
        } else if (p[i] == '\\' || p[i] == '\'' || p[i] == '\n' || p[i] == '\t') {
            esc[0] = '\\';
            esc[1] = p[i] == '\n' ? 'n' : p[i] == '\t' ? 't' : (char)p[i];
            put(ctx, esc, 2);
        } else if (p[i] < 0x20 || p[i] >= 0x7f) {
            put(ctx, esc, (size_t)snprintf(esc, sizeof esc, "\\x%02x", p[i]));
        } else {
            put(ctx, s + i, 1);
        }
    }
    put(ctx, "'", 1);
}
