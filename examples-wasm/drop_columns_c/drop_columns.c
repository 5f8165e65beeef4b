/*
 * drop_columns_c: a Datum transform written in C, against ABI v1
 * (docs/abi.md) with no SDK: the exports, a small MessagePack reader and
 * writer, and the module itself are all in this file.
 *
 * It drops the configured columns from every row change (insert, update,
 * delete, snapshot): from `columns`, `new` and `old` alike. A change that
 * holds none of them, a truncate and a logical message are answered by their
 * index, so the host keeps them exactly as they came; a rewritten change
 * copies every other field and every value byte for byte, so nothing is
 * decoded that is not needed. With `tables`, only those tables lose columns.
 *
 *     drop = ["ssn", "password_hash"]   # required, at least one name
 *     tables = ["public.users"]         # optional: "schema.table" names
 *
 * Malformed input never traps: the reader checks every length against the
 * bytes that are left and bounds nesting, and the module answers with the
 * ABI's error envelope instead.
 *
 * Built as a WASI reactor (`-mexec-model=reactor`): wasi-libc's
 * `_initialize` runs the C constructors once, and the host calls it once
 * after instantiation, before `datum_init`.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))

/* How deep values may nest (arrays in arrays, tagged maps): far more than
 * PostgreSQL's six array dimensions, and little enough stack. */
#define MAX_DEPTH 64

/* ------------------------------------------------------------------------ */
/* Reading MessagePack. A reader is a cursor over bytes that the caller owns;
 * any read past the end, or of the wrong type, clears `ok` and every later
 * read fails too, so callers check `ok` once at the end of a step. */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int ok;
} reader;

typedef struct {
    const uint8_t *s;
    uint32_t len;
} span;

static int rd_has(reader *r, uint64_t n) {
    if (!r->ok || (uint64_t)(r->end - r->p) < n) {
        r->ok = 0;
        return 0;
    }
    return 1;
}

static uint64_t rd_be(reader *r, int n) {
    uint64_t v = 0;
    if (!rd_has(r, (uint64_t)n)) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        v = (v << 8) | r->p[i];
    }
    r->p += n;
    return v;
}

/* The next marker byte, without consuming it; -1 at the end. */
static int rd_peek(const reader *r) {
    return (r->ok && r->p < r->end) ? r->p[0] : -1;
}

static int rd_map(reader *r, uint32_t *n) {
    int m = rd_peek(r);
    if (m >= 0x80 && m <= 0x8f) {
        r->p++;
        *n = (uint32_t)(m & 0x0f);
    } else if (m == 0xde) {
        r->p++;
        *n = (uint32_t)rd_be(r, 2);
    } else if (m == 0xdf) {
        r->p++;
        *n = (uint32_t)rd_be(r, 4);
    } else {
        r->ok = 0;
    }
    return r->ok;
}

static int rd_array(reader *r, uint32_t *n) {
    int m = rd_peek(r);
    if (m >= 0x90 && m <= 0x9f) {
        r->p++;
        *n = (uint32_t)(m & 0x0f);
    } else if (m == 0xdc) {
        r->p++;
        *n = (uint32_t)rd_be(r, 2);
    } else if (m == 0xdd) {
        r->p++;
        *n = (uint32_t)rd_be(r, 4);
    } else {
        r->ok = 0;
    }
    return r->ok;
}

static int rd_str(reader *r, span *out) {
    int m = rd_peek(r);
    uint64_t len;
    if (m >= 0xa0 && m <= 0xbf) {
        r->p++;
        len = (uint64_t)(m & 0x1f);
    } else if (m == 0xd9) {
        r->p++;
        len = rd_be(r, 1);
    } else if (m == 0xda) {
        r->p++;
        len = rd_be(r, 2);
    } else if (m == 0xdb) {
        r->p++;
        len = rd_be(r, 4);
    } else {
        r->ok = 0;
        return 0;
    }
    if (!rd_has(r, len)) {
        return 0;
    }
    out->s = r->p;
    out->len = (uint32_t)len;
    r->p += len;
    return 1;
}

/* Skips one value of any type, checking every length. */
static int rd_skip(reader *r, int depth) {
    int m = rd_peek(r);
    uint64_t n = 0;
    if (m < 0 || depth > MAX_DEPTH) {
        r->ok = 0;
        return 0;
    }
    r->p++;
    if (m <= 0x7f || m >= 0xe0 || m == 0xc0 || m == 0xc2 || m == 0xc3) {
        return 1; /* fixint, nil, bool */
    }
    if (m >= 0xa0 && m <= 0xbf) {
        if (!rd_has(r, (uint64_t)(m & 0x1f))) {
            return 0;
        }
        r->p += m & 0x1f; /* fixstr */
        return 1;
    }
    if ((m >= 0x80 && m <= 0x8f) || m == 0xde || m == 0xdf) {
        n = m <= 0x8f ? (uint64_t)(m & 0x0f) : rd_be(r, m == 0xde ? 2 : 4);
        n *= 2; /* keys and values */
    } else if ((m >= 0x90 && m <= 0x9f) || m == 0xdc || m == 0xdd) {
        n = m <= 0x9f ? (uint64_t)(m & 0x0f) : rd_be(r, m == 0xdc ? 2 : 4);
    } else {
        uint64_t skip;
        switch (m) {
        case 0xc4: case 0xd9: skip = rd_be(r, 1); break;      /* bin8, str8 */
        case 0xc5: case 0xda: skip = rd_be(r, 2); break;      /* bin16, str16 */
        case 0xc6: case 0xdb: skip = rd_be(r, 4); break;      /* bin32, str32 */
        case 0xc7: skip = rd_be(r, 1) + 1; break;             /* ext8 + type */
        case 0xc8: skip = rd_be(r, 2) + 1; break;             /* ext16 + type */
        case 0xc9: skip = rd_be(r, 4) + 1; break;             /* ext32 + type */
        case 0xca: skip = 4; break;                           /* float32 */
        case 0xcb: skip = 8; break;                           /* float64 */
        case 0xcc: case 0xd0: skip = 1; break;                /* (u)int8 */
        case 0xcd: case 0xd1: skip = 2; break;                /* (u)int16 */
        case 0xce: case 0xd2: skip = 4; break;                /* (u)int32 */
        case 0xcf: case 0xd3: skip = 8; break;                /* (u)int64 */
        case 0xd4: skip = 2; break;                           /* fixext1..16 */
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        default: r->ok = 0; return 0;                         /* 0xc1 */
        }
        if (!rd_has(r, skip)) {
            return 0;
        }
        r->p += skip;
        return 1;
    }
    /* Each element takes at least a byte, so a count larger than what is
     * left fails at once instead of looping. */
    if (!rd_has(r, n)) {
        return 0;
    }
    for (uint64_t i = 0; i < n && r->ok; i++) {
        rd_skip(r, depth + 1);
    }
    return r->ok;
}

static int span_is(span s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.s, lit, n) == 0;
}

/* ------------------------------------------------------------------------ */
/* Writing MessagePack into a growing buffer from malloc. */

typedef struct {
    uint8_t *buf;
    size_t len;
    size_t cap;
    int ok;
} writer;

static void wr_bytes(writer *w, const void *data, size_t n) {
    if (!w->ok) {
        return;
    }
    if (n > w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len < n) {
            if (cap > SIZE_MAX / 2) {
                w->ok = 0;
                return;
            }
            cap *= 2;
        }
        uint8_t *grown = realloc(w->buf, cap);
        if (!grown) {
            w->ok = 0;
            return;
        }
        w->buf = grown;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, data, n);
    w->len += n;
}

static void wr_be(writer *w, uint8_t marker, uint64_t v, int n) {
    uint8_t b[9];
    b[0] = marker;
    for (int i = 0; i < n; i++) {
        b[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    }
    wr_bytes(w, b, (size_t)n + 1);
}

/* The smallest encodings, as the host writes them. */
static void wr_uint(writer *w, uint64_t v) {
    if (v <= 0x7f) {
        uint8_t b = (uint8_t)v;
        wr_bytes(w, &b, 1);
    } else if (v <= 0xff) {
        wr_be(w, 0xcc, v, 1);
    } else if (v <= 0xffff) {
        wr_be(w, 0xcd, v, 2);
    } else if (v <= 0xffffffffu) {
        wr_be(w, 0xce, v, 4);
    } else {
        wr_be(w, 0xcf, v, 8);
    }
}

static void wr_header(writer *w, uint32_t n, uint8_t fix, uint8_t m16, uint8_t m32) {
    if (n <= 15) {
        uint8_t b = (uint8_t)(fix | n);
        wr_bytes(w, &b, 1);
    } else if (n <= 0xffff) {
        wr_be(w, m16, n, 2);
    } else {
        wr_be(w, m32, n, 4);
    }
}

static void wr_map(writer *w, uint32_t n) { wr_header(w, n, 0x80, 0xde, 0xdf); }
static void wr_array(writer *w, uint32_t n) { wr_header(w, n, 0x90, 0xdc, 0xdd); }

static void wr_str(writer *w, const void *s, size_t len) {
    if (len <= 31) {
        uint8_t b = (uint8_t)(0xa0 | len);
        wr_bytes(w, &b, 1);
    } else if (len <= 0xff) {
        wr_be(w, 0xd9, len, 1);
    } else if (len <= 0xffff) {
        wr_be(w, 0xda, len, 2);
    } else {
        wr_be(w, 0xdb, len, 4);
    }
    wr_bytes(w, s, len);
}

static void wr_cstr(writer *w, const char *s) { wr_str(w, s, strlen(s)); }

/* ------------------------------------------------------------------------ */
/* Results. A result is a buffer from malloc, packed as (ptr << 32) | len;
 * the host copies it out and hands it back through datum_dealloc. */

/* What to answer when not even an error envelope can be allocated:
 * {"error": {"message": "out of memory"}}. Never freed. */
static const uint8_t OUT_OF_MEMORY[] = {
    0x81, 0xa5, 'e', 'r', 'r', 'o', 'r', 0x81, 0xa7, 'm', 'e', 's', 's', 'a', 'g', 'e',
    0xad, 'o', 'u', 't', ' ', 'o', 'f', ' ', 'm', 'e', 'm', 'o', 'r', 'y'};

static uint64_t pack(const uint8_t *ptr, size_t len) {
    return ((uint64_t)(uintptr_t)ptr << 32) | (uint64_t)(uint32_t)len;
}

static uint64_t finish(writer *w) {
    if (!w->ok) {
        free(w->buf);
        return pack(OUT_OF_MEMORY, sizeof OUT_OF_MEMORY);
    }
    return pack(w->buf, w->len);
}

/* A message of up to three parts: what the module says is short text of its
 * own plus, at most, a name from the configuration. */
typedef struct {
    char text[256];
    size_t len;
} message;

static void msg_add(message *m, const void *s, size_t n) {
    size_t room = sizeof m->text - m->len;
    if (n > room) {
        n = room;
    }
    memcpy(m->text + m->len, s, n);
    m->len += n;
}

static void msg_cstr(message *m, const char *s) { msg_add(m, s, strlen(s)); }

static void msg_uint(message *m, uint32_t v) {
    char digits[10];
    int n = 0;
    do {
        digits[sizeof digits - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    msg_add(m, digits + sizeof digits - n, (size_t)n);
}

/* Whether `s` is valid UTF-8 (the host reads messages as strings). */
static int utf8_valid(span s) {
    for (uint32_t i = 0; i < s.len;) {
        uint8_t c = s.s[i];
        uint32_t more = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 9;
        if (more == 9 || more > s.len - i - 1) {
            return 0;
        }
        for (uint32_t k = 1; k <= more; k++) {
            if ((s.s[i + k] & 0xc0) != 0x80) {
                return 0;
            }
        }
        i += more + 1;
    }
    return 1;
}

/* A configured name, quoted, when it can be shown. */
static void msg_name(message *m, span name) {
    if (name.len <= 64 && utf8_valid(name)) {
        msg_cstr(m, "`");
        msg_add(m, name.s, name.len);
        msg_cstr(m, "`");
    } else {
        msg_cstr(m, "a key that cannot be shown");
    }
}

/* {"error": {"message": ..., "index": ...}}; `index` < 0 for none. */
static uint64_t error_result(const message *m, int64_t index) {
    writer w = {NULL, 0, 0, 1};
    wr_map(&w, 1);
    wr_cstr(&w, "error");
    wr_map(&w, index >= 0 ? 2 : 1);
    wr_cstr(&w, "message");
    wr_str(&w, m->text, m->len);
    if (index >= 0) {
        wr_cstr(&w, "index");
        wr_uint(&w, (uint64_t)index);
    }
    return finish(&w);
}

static uint64_t error_text(const char *text, int64_t index) {
    message m = {{0}, 0};
    msg_cstr(&m, text);
    return error_result(&m, index);
}

/* ------------------------------------------------------------------------ */
/* Memory exports. */

EXPORT("datum_abi_v1") void datum_abi_v1(void) {}

EXPORT("datum_alloc") uint8_t *datum_alloc(uint32_t len) {
    /* Never 0, even for len 0. On failure, 0: the host reports it. */
    return malloc(len ? len : 1);
}

EXPORT("datum_dealloc") void datum_dealloc(uint8_t *ptr, uint32_t len) {
    (void)len;
    if (ptr != OUT_OF_MEMORY) {
        free(ptr); /* free(NULL), for a (0, 0), does nothing */
    }
}

/* ------------------------------------------------------------------------ */
/* Configuration. The names point into the configuration's buffer, which the
 * module keeps for the instance's life. */

static span *drop_names;
static uint32_t drop_count;
static span *table_names; /* "schema.table" */
static uint32_t table_count;
static int has_tables;
static int configured;

/* Reads an array of non-empty UTF-8 strings into a new array of spans. */
static const char *read_names(reader *r, span **out, uint32_t *count) {
    uint32_t n;
    if (!rd_array(r, &n) || !rd_has(r, n)) {
        return "is not a list of strings";
    }
    span *names = malloc(sizeof(span) * (n ? n : 1));
    if (!names) {
        return "does not fit in memory";
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!rd_str(r, &names[i]) || names[i].len == 0 || !utf8_valid(names[i])) {
            free(names);
            return "is not a list of non-empty strings";
        }
    }
    *out = names;
    *count = n;
    return NULL;
}

EXPORT("datum_init") uint64_t datum_init(const uint8_t *ptr, uint32_t len) {
    reader r = {ptr, ptr + len, 1};
    uint32_t n;
    message m = {{0}, 0};
    if (!rd_map(&r, &n)) {
        return error_text("the configuration is not a map", -1);
    }
    for (uint32_t i = 0; i < n; i++) {
        span key;
        if (!rd_str(&r, &key)) {
            return error_text("the configuration has a key that is not a string", -1);
        }
        const char *why;
        if (span_is(key, "drop")) {
            why = read_names(&r, &drop_names, &drop_count);
        } else if (span_is(key, "tables")) {
            why = read_names(&r, &table_names, &table_count);
            has_tables = 1;
            for (uint32_t t = 0; !why && t < table_count; t++) {
                const uint8_t *dot = memchr(table_names[t].s, '.', table_names[t].len);
                if (!dot || dot == table_names[t].s || dot == table_names[t].s + table_names[t].len - 1) {
                    msg_cstr(&m, "`tables`: ");
                    msg_name(&m, table_names[t]);
                    msg_cstr(&m, " is not `schema.table`");
                    return error_result(&m, -1);
                }
            }
        } else {
            msg_cstr(&m, "unknown key ");
            msg_name(&m, key);
            msg_cstr(&m, " (this module reads `drop` and `tables`)");
            return error_result(&m, -1);
        }
        if (why) {
            msg_cstr(&m, "`");
            msg_add(&m, key.s, key.len);
            msg_cstr(&m, "` ");
            msg_cstr(&m, why);
            return error_result(&m, -1);
        }
    }
    if (!r.ok || r.p != r.end) {
        return error_text("the configuration is not valid MessagePack", -1);
    }
    if (drop_count == 0) {
        return error_text("`drop` is required: a list of at least one column name", -1);
    }
    configured = 1;
    return 0; /* success; {} would do as well */
}

/* ------------------------------------------------------------------------ */
/* The transform. */

static int is_dropped(span name) {
    for (uint32_t i = 0; i < drop_count; i++) {
        if (name.len == drop_names[i].len && memcmp(name.s, drop_names[i].s, name.len) == 0) {
            return 1;
        }
    }
    return 0;
}

static int table_selected(span schema, span table) {
    if (!has_tables) {
        return 1;
    }
    for (uint32_t i = 0; i < table_count; i++) {
        span t = table_names[i];
        if (t.len == (uint64_t)schema.len + 1 + table.len && memcmp(t.s, schema.s, schema.len) == 0 &&
            t.s[schema.len] == '.' && memcmp(t.s + schema.len + 1, table.s, table.len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* The `name` of a column map (`{name, type, key}`), if it has one. */
static int column_name(reader r, span *name) {
    uint32_t n;
    if (!rd_map(&r, &n)) {
        return 0;
    }
    for (uint32_t i = 0; i < n && r.ok; i++) {
        span key;
        if (!rd_str(&r, &key)) {
            return 0;
        }
        if (span_is(key, "name")) {
            return rd_str(&r, name);
        }
        rd_skip(&r, 1);
    }
    return 0;
}

/* What a change says, as far as this module cares. */
typedef struct {
    span op, schema, table;
    int has_op;
    int listed; /* a dropped column appears in columns, new or old */
} change_info;

/* Reads one change, checking its shape; NULL, or why it is malformed. */
static const char *scan_change(reader *r, change_info *c) {
    uint32_t fields;
    static const uint8_t empty[1] = {0};
    memset(c, 0, sizeof *c);
    c->op.s = c->schema.s = c->table.s = empty; /* a missing field reads as "" */
    if (!rd_map(r, &fields)) {
        return "is not a map";
    }
    for (uint32_t f = 0; f < fields; f++) {
        span key;
        if (!rd_str(r, &key)) {
            return "has a key that is not a string";
        }
        if (span_is(key, "op") || span_is(key, "schema") || span_is(key, "table")) {
            span *field = key.s[0] == 'o' ? &c->op : key.s[0] == 's' ? &c->schema : &c->table;
            if (!rd_str(r, field)) {
                return key.s[0] == 'o' ? "has an `op` that is not a string"
                       : key.s[0] == 's' ? "has a `schema` that is not a string"
                                         : "has a `table` that is not a string";
            }
            c->has_op |= key.s[0] == 'o';
        } else if (span_is(key, "columns")) {
            uint32_t n;
            if (!rd_array(r, &n)) {
                return "has `columns` that are not a list";
            }
            for (uint32_t i = 0; i < n; i++) {
                span name;
                int m = rd_peek(r);
                if (!((m >= 0x80 && m <= 0x8f) || m == 0xde || m == 0xdf)) {
                    return "has a column that is not a map";
                }
                if (column_name(*r, &name) && is_dropped(name)) {
                    c->listed = 1;
                }
                if (!rd_skip(r, 1)) {
                    return "is truncated or not valid MessagePack";
                }
            }
        } else if (span_is(key, "new") || span_is(key, "old")) {
            uint32_t n;
            if (!rd_map(r, &n)) {
                return key.s[0] == 'n' ? "has a `new` row that is not a map"
                                       : "has an `old` row that is not a map";
            }
            for (uint32_t i = 0; i < n; i++) {
                span name;
                if (!rd_str(r, &name)) {
                    return "has a row with a column name that is not a string";
                }
                c->listed |= is_dropped(name);
                if (!rd_skip(r, 1)) {
                    return "is truncated or not valid MessagePack";
                }
            }
        } else if (!rd_skip(r, 1)) {
            return "is truncated or not valid MessagePack";
        }
    }
    if (!r->ok) {
        return "is truncated or not valid MessagePack";
    }
    if (!c->has_op) {
        return "has no `op`";
    }
    return NULL;
}

static int is_row_op(span op) {
    return span_is(op, "insert") || span_is(op, "update") || span_is(op, "delete") ||
           span_is(op, "snapshot");
}

/* Copies the bytes a reader moves over while skipping one value. */
static void copy_value(reader *r, writer *w) {
    const uint8_t *start = r->p;
    if (rd_skip(r, 1)) {
        wr_bytes(w, start, (size_t)(r->p - start));
    }
}

/* Writes a change that scan_change accepted, without the dropped columns;
 * every other field and value is copied as it came. */
static void write_without_dropped(reader r, writer *w) {
    uint32_t fields;
    rd_map(&r, &fields);
    wr_map(w, fields);
    for (uint32_t f = 0; f < fields && r.ok; f++) {
        const uint8_t *key_start = r.p;
        span key;
        rd_str(&r, &key);
        wr_bytes(w, key_start, (size_t)(r.p - key_start));
        uint32_t n, kept = 0;
        if (span_is(key, "columns")) {
            rd_array(&r, &n);
            reader count = r;
            for (uint32_t i = 0; i < n; i++) {
                span name;
                kept += !(column_name(count, &name) && is_dropped(name));
                rd_skip(&count, 1);
            }
            wr_array(w, kept);
            for (uint32_t i = 0; i < n; i++) {
                span name;
                if (column_name(r, &name) && is_dropped(name)) {
                    rd_skip(&r, 1);
                } else {
                    copy_value(&r, w);
                }
            }
        } else if (span_is(key, "new") || span_is(key, "old")) {
            rd_map(&r, &n);
            reader count = r;
            for (uint32_t i = 0; i < n; i++) {
                span name;
                rd_str(&count, &name);
                kept += !is_dropped(name);
                rd_skip(&count, 1);
            }
            wr_map(w, kept);
            for (uint32_t i = 0; i < n; i++) {
                const uint8_t *name_start = r.p;
                span name;
                rd_str(&r, &name);
                if (is_dropped(name)) {
                    rd_skip(&r, 1);
                } else {
                    wr_bytes(w, name_start, (size_t)(r.p - name_start));
                    copy_value(&r, w);
                }
            }
        } else {
            copy_value(&r, w);
        }
    }
}

static uint64_t transform(const uint8_t *ptr, uint32_t len) {
    reader r = {ptr, ptr + len, 1};
    writer w = {NULL, 0, 0, 1};
    uint32_t fields, seen_changes = 0;
    if (!configured) {
        return error_text("the module was not configured (datum_init was not called)", -1);
    }
    if (!rd_map(&r, &fields)) {
        return error_text("the batch is not a map", -1);
    }
    for (uint32_t f = 0; f < fields; f++) {
        span key;
        if (!rd_str(&r, &key)) {
            free(w.buf);
            return error_text("the batch has a key that is not a string", -1);
        }
        if (!span_is(key, "changes")) {
            if (!rd_skip(&r, 0)) {
                free(w.buf);
                return error_text("the batch is truncated or not valid MessagePack", -1);
            }
            continue;
        }
        uint32_t n;
        if (seen_changes++ || !rd_array(&r, &n)) {
            free(w.buf);
            return error_text("the batch's `changes` is not one list", -1);
        }
        wr_map(&w, 1);
        wr_cstr(&w, "changes");
        wr_array(&w, n);
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *start = r.p;
            change_info c;
            const char *why = scan_change(&r, &c);
            if (why) {
                message m = {{0}, 0};
                msg_cstr(&m, "change ");
                msg_uint(&m, i);
                msg_cstr(&m, " ");
                msg_cstr(&m, why);
                free(w.buf);
                return error_result(&m, i);
            }
            if (c.listed && is_row_op(c.op) && table_selected(c.schema, c.table)) {
                write_without_dropped((reader){start, r.p, 1}, &w);
            } else {
                wr_uint(&w, i); /* kept as it came */
            }
        }
    }
    if (!r.ok || r.p != r.end) {
        free(w.buf);
        return error_text("the batch is truncated or has bytes after its end", -1);
    }
    if (!seen_changes) {
        free(w.buf);
        return error_text("the batch has no `changes`", -1);
    }
    return finish(&w);
}

EXPORT("datum_transform") uint64_t datum_transform(uint8_t *ptr, uint32_t len) {
    uint64_t result = transform(ptr, len);
    free(ptr); /* the input buffer is the module's once the call starts */
    return result;
}
