/* Model-file (container) validation in C, and the CRC32 both readers share (docs/packing.md, model file).
 *
 * The byte layout is specified once, in quant/pack/container.py (writer + Python reader); this file checks the same
 * rules so a C runner never trusts a malformed file: every length and offset is bounds-checked before it is used,
 * every failure returns an EF_E_* code and a one-line message naming the tensor and the byte offset.
 * CRC32 is the zlib/PNG polynomial (0xEDB88320, reflected), so zlib.crc32 in Python gives the same value.
 *
 * One rule, both readers (docs/packing.md "Model file"): canonical layout (index right after the header, metadata right
 * after the index, tensor i at the first alignment boundary after the previous section, the file ends right after the
 * last tensor), every padding byte zero, names strict UTF-8 and unique, metadata strict UTF-8 RFC 8259 JSON with an
 * object at the top level, nested at most EF_MAX_JSON_DEPTH deep, integer literals of at most EF_MAX_INT_DIGITS
 * digits (Python's int() limit), and a 1-D float32 tensor has D = 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ef.h"

/* ---- CRC32, slicing-by-4 tables built once ---- */
static uint32_t CRC_T[4][256];
static int crc_ready = 0;

__attribute__((constructor)) static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        CRC_T[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 4; t++) CRC_T[t][i] = (CRC_T[t - 1][i] >> 8) ^ CRC_T[0][CRC_T[t - 1][i] & 0xFF];
    crc_ready = 1;
}

uint32_t ef_crc32(uint32_t crc, const uint8_t *buf, uint64_t len) {
    if (!crc_ready) crc_init();
    uint32_t c = ~crc;
    while (len >= 4) {
        c ^= (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
        c = CRC_T[3][c & 0xFF] ^ CRC_T[2][(c >> 8) & 0xFF] ^ CRC_T[1][(c >> 16) & 0xFF] ^ CRC_T[0][c >> 24];
        buf += 4;
        len -= 4;
    }
    while (len--) c = CRC_T[0][(c ^ *buf++) & 0xFF] ^ (c >> 8);
    return ~c;
}

/* ---- layout constants (must equal quant/pack/container.py) ---- */
#define EF_MAGIC "EDGEFLW\0"
#define EF_VERSION 1u
#define EF_HEADER_SIZE 64u
#define EF_ENTRY_SIZE 176u
#define EF_NAME_LEN 96u
#define EF_MAX_ELEMS (1ull << 40)
#define FAIL(code, ...)                                  \
    do {                                                 \
        if (err && errlen > 0) snprintf(err, (size_t)errlen, __VA_ARGS__); \
        return (code);                                   \
    } while (0)
#define EF_MAX_JSON_DEPTH 64
#define EF_MAX_INT_DIGITS 4300

/* Streaming readers check the zero padding in front of tensor i (i == n: after the metadata of a file without
 * tensors) with these two; ef_container_check does it on the whole buffer. */
int ef_container_gap(const uint8_t *head, uint64_t avail, uint32_t i, uint64_t *start, uint64_t *len);
int ef_container_check_gap(const uint8_t *head, uint64_t avail, uint32_t i, const uint8_t *gap, uint64_t gap_len,
                           char *err, int errlen);

/* ---- strict UTF-8 (the same sequences Python's "utf-8" codec accepts) ---- */
static uint64_t utf8_len(const uint8_t *p, uint64_t n) {
    /* length of the valid UTF-8 sequence at p (1..4), 0 when invalid */
    const uint8_t c = p[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (p[2] & 0xC0) != 0x80) return 0;
        const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        const uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 4 : 0;
    }
    return 0;
}

/* offset of the first invalid byte, or n when all of p[0..n) is valid UTF-8 */
static uint64_t utf8_check(const uint8_t *p, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        const uint64_t k = utf8_len(p + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* ---- RFC 8259 JSON syntax (no NaN / Infinity), validated text only ---- */
typedef struct {
    const uint8_t *p;
    uint64_t n, i;
} js_t;

static void js_ws(js_t *j) {
    while (j->i < j->n && (j->p[j->i] == ' ' || j->p[j->i] == '\t' || j->p[j->i] == '\n' || j->p[j->i] == '\r')) j->i++;
}
static int js_digit(js_t *j) { return j->i < j->n && j->p[j->i] >= '0' && j->p[j->i] <= '9'; }
static int js_value(js_t *j, int depth);

static int js_string(js_t *j) {
    if (j->i >= j->n || j->p[j->i] != '"') return 0;
    j->i++;
    while (j->i < j->n) {
        const uint8_t c = j->p[j->i];
        if (c == '"') {
            j->i++;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (++j->i >= j->n) return 0;
            const uint8_t e = j->p[j->i];
            if (e == 'u') {
                for (int k = 1; k <= 4; k++) {
                    if (j->i + k >= j->n) return 0;
                    const uint8_t h = j->p[j->i + k];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return 0;
                }
                j->i += 5;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return 0;
            j->i++;
            continue;
        }
        j->i++;
    }
    return 0;
}

static int js_number(js_t *j) {
    const uint64_t start = j->i;
    int is_int = 1;
    if (j->i < j->n && j->p[j->i] == '-') j->i++;
    if (!js_digit(j)) return 0;
    if (j->p[j->i] == '0') j->i++;
    else
        while (js_digit(j)) j->i++;
    if (j->i < j->n && j->p[j->i] == '.') {
        j->i++;
        is_int = 0;
        if (!js_digit(j)) return 0;
        while (js_digit(j)) j->i++;
    }
    if (j->i < j->n && (j->p[j->i] == 'e' || j->p[j->i] == 'E')) {
        j->i++;
        is_int = 0;
        if (j->i < j->n && (j->p[j->i] == '+' || j->p[j->i] == '-')) j->i++;
        if (!js_digit(j)) return 0;
        while (js_digit(j)) j->i++;
    }
    const uint64_t digits = j->i - start - (j->p[start] == '-');
    return !(is_int && digits > EF_MAX_INT_DIGITS);
}

static int js_lit(js_t *j, const char *w) {
    const uint64_t k = strlen(w);
    if (j->n - j->i < k || memcmp(j->p + j->i, w, k) != 0) return 0;
    j->i += k;
    return 1;
}

static int js_value(js_t *j, int depth) {
    js_ws(j);
    if (j->i >= j->n) return 0;
    const uint8_t c = j->p[j->i];
    if (c == '{' || c == '[') {
        if (depth >= EF_MAX_JSON_DEPTH) return 0;
        const uint8_t close = c == '{' ? '}' : ']';
        j->i++;
        js_ws(j);
        if (j->i < j->n && j->p[j->i] == close) {
            j->i++;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                js_ws(j);
                if (!js_string(j)) return 0;
                js_ws(j);
                if (j->i >= j->n || j->p[j->i] != ':') return 0;
                j->i++;
            }
            if (!js_value(j, depth + 1)) return 0;
            js_ws(j);
            if (j->i >= j->n) return 0;
            if (j->p[j->i] == ',') {
                j->i++;
                continue;
            }
            if (j->p[j->i] == close) {
                j->i++;
                return 1;
            }
            return 0;
        }
    }
    if (c == '"') return js_string(j);
    if (c == 't') return js_lit(j, "true");
    if (c == 'f') return js_lit(j, "false");
    if (c == 'n') return js_lit(j, "null");
    return js_number(j);
}

/* 0 when meta is strict UTF-8 JSON with an object at the top level; else an offset-bearing message in err */
static int check_meta(const uint8_t *m, uint64_t n, uint64_t meta_off, char *err, int errlen) {
    const uint64_t bad = utf8_check(m, n);
    if (bad != n)
        FAIL(EF_E_HEADER, "metadata at offset %llu: not UTF-8 (byte %llu)", (unsigned long long)meta_off,
             (unsigned long long)bad);
    js_t j = {m, n, 0};
    js_ws(&j);
    const int obj = j.i < n && m[j.i] == '{';
    if (!js_value(&j, 0)) FAIL(EF_E_HEADER, "metadata at offset %llu: not valid JSON (RFC 8259, nesting <= %d)",
                               (unsigned long long)meta_off, EF_MAX_JSON_DEPTH);
    js_ws(&j);
    if (j.i != n) FAIL(EF_E_HEADER, "metadata at offset %llu: not valid JSON (extra data at byte %llu)",
                       (unsigned long long)meta_off, (unsigned long long)j.i);
    if (!obj) FAIL(EF_E_HEADER, "metadata at offset %llu: JSON top level must be an object",
                   (unsigned long long)meta_off);
    return EF_OK;
}

static int name_cmp(const void *a, const void *b) {
    return strncmp(*(const char *const *)a, *(const char *const *)b, EF_NAME_LEN);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
enum { FMT_WEIGHTLET = 0, FMT_INT8 = 1, FMT_MIXED = 2, FMT_KQUANT = 3, FMT_F32 = 4, FMT_COUNT = 5 };

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }



/* Entry i of an n-entry index at index_off lies inside the first avail bytes (no overflow: index_off and n are
 * read from the file). */
static int entry_in(uint32_t n, uint64_t index_off, uint64_t avail, uint32_t i) {
    return i < n && index_off <= avail && (uint64_t)i + 1u <= (avail - index_off) / EF_ENTRY_SIZE;
}

/* Header checks shared by ef_container_head_bytes and ef_container_check_index; fills the fields. */
static int check_header(const uint8_t *buf, uint64_t avail, uint64_t file_size, char *err, int errlen, uint32_t *n,
                        uint32_t *align, uint64_t *index_off, uint64_t *meta_off, uint64_t *meta_size) {
    if (!buf) FAIL(EF_E_ARG, "no buffer");
    if (avail < EF_HEADER_SIZE || file_size < EF_HEADER_SIZE)
        FAIL(EF_E_TRUNC, "truncated file: %llu bytes, shorter than the %u-byte header",
             (unsigned long long)(avail < file_size ? avail : file_size), EF_HEADER_SIZE);
    if (memcmp(buf, EF_MAGIC, 8) != 0) FAIL(EF_E_MAGIC, "not an EdgeFlow packed file (bad magic at offset 0)");
    const uint32_t version = rd32(buf + 8);
    if (version != EF_VERSION)
        FAIL(EF_E_VERSION, "unsupported file version %u at offset 8 (this reader reads version %u)", version, EF_VERSION);
    if (rd32(buf + 60) != ef_crc32(0, buf, 60)) FAIL(EF_E_HEADER, "header checksum mismatch (offset 60)");
    const uint32_t hsize = rd32(buf + 12);
    *n = rd32(buf + 16);
    *align = rd32(buf + 20);
    *index_off = rd64(buf + 24);
    *meta_off = rd64(buf + 32);
    *meta_size = rd64(buf + 40);
    const uint64_t fsize = rd64(buf + 48), len = file_size;
    if (hsize != EF_HEADER_SIZE) FAIL(EF_E_HEADER, "bad header size %u at offset 12", hsize);
    if (*align < 64 || (*align & (*align - 1))) FAIL(EF_E_HEADER, "bad alignment %u at offset 20", *align);
    if (fsize != len)
        FAIL(EF_E_TRUNC, "truncated or padded file: %llu bytes, header says %llu (offset 48)", (unsigned long long)len,
             (unsigned long long)fsize);
    if (*index_off < EF_HEADER_SIZE || *index_off > len || (uint64_t)*n * EF_ENTRY_SIZE > len - *index_off)
        FAIL(EF_E_INDEX, "tensor index (%u entries at offset %llu) out of bounds", *n, (unsigned long long)*index_off);
    if (*meta_off > len || *meta_size > len - *meta_off)
        FAIL(EF_E_HEADER, "metadata (%llu bytes at offset %llu) out of bounds", (unsigned long long)*meta_size,
             (unsigned long long)*meta_off);
    return EF_OK;
}

int64_t ef_container_head_bytes(const uint8_t *head, uint64_t avail, uint64_t file_size, char *err, int errlen) {
    uint32_t n, align;
    uint64_t index_off, meta_off, meta_size;
    const int rc = check_header(head, avail, file_size, err, errlen, &n, &align, &index_off, &meta_off,
                                &meta_size);
    if (rc) return rc;
    const uint64_t a = index_off + (uint64_t)n * EF_ENTRY_SIZE, b = meta_off + meta_size;
    return (int64_t)(a > b ? a : b);
}

int ef_container_check_index(const uint8_t *buf, uint64_t avail, uint64_t len, char *err, int errlen) {
    uint32_t n, align;
    uint64_t index_off, meta_off, meta_size;
    int rc = check_header(buf, avail, len, err, errlen, &n, &align, &index_off, &meta_off, &meta_size);
    if (rc) return rc;
    const uint64_t need_a = index_off + (uint64_t)n * EF_ENTRY_SIZE, need_b = meta_off + meta_size;
    if (avail < need_a || avail < need_b)
        FAIL(EF_E_ARG, "need the first %llu bytes of the file for the index and metadata (given %llu)",
             (unsigned long long)(need_a > need_b ? need_a : need_b), (unsigned long long)avail);
    if (rd32(buf + 56) != ef_crc32(ef_crc32(0, buf + index_off, (uint64_t)n * EF_ENTRY_SIZE), buf + meta_off, meta_size))
        FAIL(EF_E_INDEX, "tensor index or metadata checksum mismatch (index at offset %llu, metadata at offset %llu)",
             (unsigned long long)index_off, (unsigned long long)meta_off);
    if (index_off != EF_HEADER_SIZE || meta_off != index_off + (uint64_t)n * EF_ENTRY_SIZE)
        FAIL(EF_E_INDEX, "non-canonical layout: index at offset %llu, metadata at offset %llu (expected %u and %llu)",
             (unsigned long long)index_off, (unsigned long long)meta_off, EF_HEADER_SIZE,
             (unsigned long long)(EF_HEADER_SIZE + (uint64_t)n * EF_ENTRY_SIZE));
    rc = check_meta(buf + meta_off, meta_size, meta_off, err, errlen);
    if (rc) return rc;
    uint64_t pos = align_up(meta_off + meta_size, align), end = pos;

    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = buf + index_off + (uint64_t)i * EF_ENTRY_SIZE;
        const uint64_t eoff = index_off + (uint64_t)i * EF_ENTRY_SIZE;
        char name[EF_NAME_LEN + 1];
        memcpy(name, e, EF_NAME_LEN);
        name[EF_NAME_LEN] = 0;
        if (name[0] == 0 || memchr(e, 0, EF_NAME_LEN) == NULL)
            FAIL(EF_E_INDEX, "tensor #%u: bad name in index entry at offset %llu", i, (unsigned long long)eoff);
        if (utf8_check(e, strlen(name)) != strlen(name))
            FAIL(EF_E_INDEX, "tensor #%u: name is not UTF-8 (index entry at offset %llu)", i, (unsigned long long)eoff);
        const uint32_t fmt = rd32(e + 96), group = rd32(e + 100);
        const uint64_t C = rd64(e + 104), D = rd64(e + 112), off = rd64(e + 120), size = rd64(e + 128);
        const uint64_t bits_off = rd64(e + 136), sc_off = rd64(e + 144), pl_off = rd64(e + 152), pl_size = rd64(e + 160);
#define TFAIL(code, fmtstr, ...) \
    FAIL(code, "tensor '%s' (#%u) at offset %llu: " fmtstr, name, i, (unsigned long long)off, __VA_ARGS__)
        if (fmt >= FMT_COUNT) TFAIL(EF_E_INDEX, "unknown format code %u (index entry at offset %llu)", fmt,
                                    (unsigned long long)eoff);
        if (C > EF_MAX_ELEMS || D > EF_MAX_ELEMS || (D && C > EF_MAX_ELEMS / D))
            TFAIL(EF_E_INDEX, "implausible shape (%llu, %llu)", (unsigned long long)C, (unsigned long long)D);
        if (off % align) TFAIL(EF_E_INDEX, "data not aligned to %u bytes%s", align, "");
        if (off > len || size > len - off)
            TFAIL(EF_E_TRUNC, "data (%llu bytes) runs past the end of the %llu-byte file", (unsigned long long)size,
                  (unsigned long long)len);
        const uint64_t nbits = fmt == FMT_F32 ? 0 : (C * 3u + 7u) / 8u;
        const uint64_t nsc = fmt == FMT_F32 ? 0 : C * 4u;
        if (bits_off != 0 || sc_off < nbits || pl_off < sc_off || pl_off - sc_off < nsc || pl_off > size ||
            pl_size != size - pl_off)
            TFAIL(EF_E_INDEX, "inconsistent section offsets (bits %llu, scales %llu, payload %llu+%llu, size %llu)",
                  (unsigned long long)bits_off, (unsigned long long)sc_off, (unsigned long long)pl_off,
                  (unsigned long long)pl_size, (unsigned long long)size);
        if (fmt == FMT_F32 && !(group == 1 || group == 2)) TFAIL(EF_E_INDEX, "bad ndim %u for a float32 tensor", group);
        if (fmt == FMT_F32 && group == 1 && D != 1)
            TFAIL(EF_E_INDEX, "1-D float32 tensor with D = %llu (must be 1)", (unsigned long long)D);
        if (fmt == FMT_F32 && pl_size != C * D * 4u)
            TFAIL(EF_E_INDEX, "payload is %llu bytes, float32 (%llu, %llu) needs %llu", (unsigned long long)pl_size,
                  (unsigned long long)C, (unsigned long long)D, (unsigned long long)(C * D * 4u));
        if (fmt == FMT_INT8 && pl_size != C * D)
            TFAIL(EF_E_INDEX, "payload is %llu bytes, int8 (%llu, %llu) needs %llu", (unsigned long long)pl_size,
                  (unsigned long long)C, (unsigned long long)D, (unsigned long long)(C * D));
        if (fmt == FMT_WEIGHTLET && group != 128 && group != 256 && group != 512)
            TFAIL(EF_E_INDEX, "bad weightlet group size %u (128, 256 or 512)", group);
        if (fmt == FMT_KQUANT && group != 32) TFAIL(EF_E_INDEX, "bad K-quant group size %u (32)", group);
        if (off != pos)
            TFAIL(EF_E_INDEX,
                  "not at the canonical offset %llu (the first %u-byte boundary after the previous section)",
                  (unsigned long long)pos, align);
        end = off + size;
        pos = align_up(end, align);
#undef TFAIL
    }
    if (len != end)
        FAIL(EF_E_INDEX, "file is %llu bytes, its sections end at %llu", (unsigned long long)len,
             (unsigned long long)end);
    if (n > 1) { /* unique names: sort pointers to the (NUL-terminated) name fields */
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names) FAIL(EF_E_ARG, "out of memory checking %u names", n);
        for (uint32_t i = 0; i < n; i++) names[i] = (const char *)(buf + index_off + (uint64_t)i * EF_ENTRY_SIZE);
        qsort(names, n, sizeof *names, name_cmp);
        for (uint32_t i = 1; i < n; i++)
            if (name_cmp(&names[i - 1], &names[i]) == 0) {
                const uint32_t k = (uint32_t)(((const uint8_t *)names[i] - buf - index_off) / EF_ENTRY_SIZE);
                char dup[EF_NAME_LEN + 1];
                memcpy(dup, names[i], EF_NAME_LEN);
                dup[EF_NAME_LEN] = 0;
                free(names);
                FAIL(EF_E_INDEX, "tensor '%s': duplicate name (index entry #%u)", dup, k);
            }
        free(names);
    }
    return EF_OK;
}

int ef_container_gap(const uint8_t *head, uint64_t avail, uint32_t i, uint64_t *start, uint64_t *len) {
    /* head passed ef_container_check_index: offsets are canonical and inside the file */
    if (!head || avail < EF_HEADER_SIZE || !start || !len) return EF_E_ARG;
    const uint32_t n = rd32(head + 16), align = rd32(head + 20);
    const uint64_t index_off = rd64(head + 24), meta_end = rd64(head + 32) + rd64(head + 40), fsize = rd64(head + 48);
    if (i > n || (i < n && !entry_in(n, index_off, avail, i)) || (i > 0 && !entry_in(n, index_off, avail, i - 1)))
        return EF_E_ARG;
    const uint8_t *prev = i ? head + index_off + (uint64_t)(i - 1) * EF_ENTRY_SIZE : NULL;
    const uint64_t a = prev ? rd64(prev + 120) + rd64(prev + 128) : meta_end;
    const uint64_t b = i < n ? rd64(head + index_off + (uint64_t)i * EF_ENTRY_SIZE + 120) : (n ? a : fsize);
    if (b < a || (i < n && b != align_up(a, align))) return EF_E_INDEX;
    *start = a;
    *len = b - a;
    return EF_OK;
}

int ef_container_check_gap(const uint8_t *head, uint64_t avail, uint32_t i, const uint8_t *gap, uint64_t gap_len,
                           char *err, int errlen) {
    uint64_t a, len;
    const int rc = ef_container_gap(head, avail, i, &a, &len);
    if (rc) FAIL(rc, "no padding #%u in the index", i);
    if (gap_len != len || (!gap && len))
        FAIL(EF_E_TRUNC, "padding at offset %llu: got %llu bytes, the index says %llu", (unsigned long long)a,
             (unsigned long long)gap_len, (unsigned long long)len);
    for (uint64_t k = 0; k < len; k++)
        if (gap[k])
            FAIL(EF_E_INDEX, "non-zero padding between offsets %llu and %llu", (unsigned long long)a,
                 (unsigned long long)(a + len));
    return EF_OK;
}

int ef_container_check_tensor(const uint8_t *head, uint64_t avail, uint32_t i, const uint8_t *blob, uint64_t blob_len,
                              int verify_crc, char *err, int errlen) {
    /* head: the first bytes of a file that passed ef_container_check_index */
    if (!head || avail < EF_HEADER_SIZE) FAIL(EF_E_ARG, "no header (%llu bytes given)", (unsigned long long)avail);
    const uint32_t n = rd32(head + 16);
    const uint64_t index_off = rd64(head + 24);
    if (!entry_in(n, index_off, avail, i)) FAIL(EF_E_ARG, "no tensor #%u in the index", i);
    const uint8_t *e = head + index_off + (uint64_t)i * EF_ENTRY_SIZE;
    char name[EF_NAME_LEN + 1];
    memcpy(name, e, EF_NAME_LEN);
    name[EF_NAME_LEN] = 0;
    const uint32_t fmt = rd32(e + 96), group = rd32(e + 100), crc = rd32(e + 168);
    const uint64_t C = rd64(e + 104), D = rd64(e + 112), off = rd64(e + 120), size = rd64(e + 128);
    const uint64_t pl_size = rd64(e + 160);
#define TFAIL(code, fmtstr, ...) \
    FAIL(code, "tensor '%s' (#%u) at offset %llu: " fmtstr, name, i, (unsigned long long)off, __VA_ARGS__)
    if (blob_len != size || (!blob && size))
        TFAIL(EF_E_TRUNC, "got %llu bytes of data, the index says %llu", (unsigned long long)blob_len,
              (unsigned long long)size);
    if (verify_crc) {
        const uint32_t got = ef_crc32(0, blob, size);
        if (got != crc) TFAIL(EF_E_CHECKSUM, "checksum mismatch (stored %08x, computed %08x)", crc, got);
    }
    if (fmt == FMT_WEIGHTLET || fmt == FMT_MIXED || fmt == FMT_KQUANT) { /* payload size follows from the bits */
        uint64_t want = 0;
        for (uint64_t c = 0; c < C; c++) {
            const int B = ef_bits_at(blob, c);
            want += fmt == FMT_WEIGHTLET ? ef_weightlet_channel_bytes(B, (int64_t)D, (int)group)
                    : fmt == FMT_MIXED   ? ef_mixed_channel_bytes(B, (int64_t)D)
                                         : ef_kquant_channel_bytes(B, (int64_t)D);
        }
        if (pl_size != want)
            TFAIL(EF_E_INDEX, "payload is %llu bytes, shape and bit widths need %llu", (unsigned long long)pl_size,
                  (unsigned long long)want);
    }
#undef TFAIL
    return EF_OK;
}

int ef_container_check(const uint8_t *buf, uint64_t len, int verify_crc, char *err, int errlen) {
    int rc = ef_container_check_index(buf, len, len, err, errlen);
    if (rc) return rc;
    const uint32_t n = rd32(buf + 16);
    const uint64_t index_off = rd64(buf + 24);
    for (uint32_t i = 0; i <= n; i++) {
        uint64_t a, glen;
        rc = ef_container_gap(buf, len, i, &a, &glen);
        if (rc) FAIL(rc, "no padding #%u in the index", i);
        rc = ef_container_check_gap(buf, len, i, buf + a, glen, err, errlen);
        if (rc) return rc;
        if (i == n) break;
        const uint8_t *e = buf + index_off + (uint64_t)i * EF_ENTRY_SIZE;
        rc = ef_container_check_tensor(buf, len, i, buf + rd64(e + 120), rd64(e + 128), verify_crc, err, errlen);
        if (rc) return rc;
    }
    return EF_OK;
}

int ef_container_tensor(const uint8_t *buf, uint64_t len, uint32_t idx, char *name96, uint32_t *fmt, uint32_t *group,
                        uint64_t *C, uint64_t *D, uint64_t *offset, uint64_t *size) {
    if (!buf || len < EF_HEADER_SIZE) return EF_E_ARG;
    const uint32_t n = rd32(buf + 16);
    const uint64_t index_off = rd64(buf + 24);
    if (!entry_in(n, index_off, len, idx)) return EF_E_ARG;
    const uint8_t *e = buf + index_off + (uint64_t)idx * EF_ENTRY_SIZE;
    if (name96) {
        memcpy(name96, e, EF_NAME_LEN);
        name96[EF_NAME_LEN - 1] = 0;
    }
    *fmt = rd32(e + 96);
    *group = rd32(e + 100);
    *C = rd64(e + 104);
    *D = rd64(e + 112);
    *offset = rd64(e + 120);
    *size = rd64(e + 128);
    return EF_OK;
}

int ef_unpack_blob(int isa, const uint8_t *head, uint64_t avail, uint32_t i, const uint8_t *blob, uint64_t blob_len,
                   int8_t *out, int64_t c0, int64_t c1, const float **scales) {
    /* Defensive even though the contract asks for a checked head and blob: every offset used below is bounds-checked
     * without overflow, so a malformed entry returns an error instead of reading outside head or blob. */
    if (!head || avail < EF_HEADER_SIZE) return EF_E_ARG;
    const uint32_t n = rd32(head + 16);
    const uint64_t index_off = rd64(head + 24);
    if (!entry_in(n, index_off, avail, i)) return EF_E_ARG;
    const uint8_t *e = head + index_off + (uint64_t)i * EF_ENTRY_SIZE;
    const uint32_t fmt = rd32(e + 96), group = rd32(e + 100);
    const uint64_t uC = rd64(e + 104), uD = rd64(e + 112);
    const uint64_t size = rd64(e + 128), sc_off = rd64(e + 144), pl_off = rd64(e + 152), pl_size = rd64(e + 160);
    if (uC > EF_MAX_ELEMS || uD > EF_MAX_ELEMS || (uD && uC > EF_MAX_ELEMS / uD)) return EF_E_INDEX;
    const int64_t C = (int64_t)uC, D = (int64_t)uD;
    if (blob_len != size || (!blob && size) || pl_off > size || pl_size != size - pl_off) return EF_E_TRUNC;
    if (fmt != FMT_F32 && (sc_off < (uC * 3u + 7u) / 8u || sc_off > pl_off || pl_off - sc_off < uC * 4u))
        return EF_E_INDEX;
    if (scales) *scales = fmt == FMT_F32 ? NULL : (const float *)(const void *)(blob + sc_off);
    switch (fmt) {
    case FMT_WEIGHTLET: return ef_unpack_weightlet(isa, blob, C, D, (int)group, blob + pl_off, pl_size, out, c0, c1);
    case FMT_INT8: return ef_unpack_int8(blob + pl_off, pl_size, C, D, out, c0, c1);
    case FMT_MIXED: return ef_unpack_mixed(isa, blob, C, D, blob + pl_off, pl_size, out, c0, c1);
    case FMT_KQUANT: return ef_unpack_kquant(isa, blob, C, D, blob + pl_off, pl_size, out, c0, c1);
    default: return EF_E_ARG; /* float32 tensors have nothing to unpack */
    }
}
