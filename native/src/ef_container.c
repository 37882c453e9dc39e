/* Model-file (container) validation in C, and the CRC32 both readers share (SPEC §3.2 "File").
 *
 * The byte layout is specified once, in quant/pack/container.py (writer + Python reader); this file checks the same
 * rules so a C runner never trusts a malformed file: every length and offset is bounds-checked before it is used,
 * every failure returns an EF_E_* code and a one-line message naming the tensor and the byte offset.
 * CRC32 is the zlib/PNG polynomial (0xEDB88320, reflected), so zlib.crc32 in Python gives the same value.
 */
#include <stdio.h>
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
enum { FMT_WEIGHTLET = 0, FMT_INT8 = 1, FMT_MIXED = 2, FMT_KQUANT = 3, FMT_F32 = 4, FMT_COUNT = 5 };

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

#define FAIL(code, ...)                                  \
    do {                                                 \
        if (err && errlen > 0) snprintf(err, (size_t)errlen, __VA_ARGS__); \
        return (code);                                   \
    } while (0)


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

    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = buf + index_off + (uint64_t)i * EF_ENTRY_SIZE;
        const uint64_t eoff = index_off + (uint64_t)i * EF_ENTRY_SIZE;
        char name[EF_NAME_LEN + 1];
        memcpy(name, e, EF_NAME_LEN);
        name[EF_NAME_LEN] = 0;
        if (name[0] == 0 || memchr(e, 0, EF_NAME_LEN) == NULL)
            FAIL(EF_E_INDEX, "tensor #%u: bad name in index entry at offset %llu", i, (unsigned long long)eoff);
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
        if (fmt == FMT_F32 && pl_size != C * D * 4u)
            TFAIL(EF_E_INDEX, "payload is %llu bytes, float32 (%llu, %llu) needs %llu", (unsigned long long)pl_size,
                  (unsigned long long)C, (unsigned long long)D, (unsigned long long)(C * D * 4u));
        if (fmt == FMT_INT8 && pl_size != C * D)
            TFAIL(EF_E_INDEX, "payload is %llu bytes, int8 (%llu, %llu) needs %llu", (unsigned long long)pl_size,
                  (unsigned long long)C, (unsigned long long)D, (unsigned long long)(C * D));
        if (fmt == FMT_WEIGHTLET && group != 128 && group != 256 && group != 512)
            TFAIL(EF_E_INDEX, "bad weightlet group size %u (128, 256 or 512)", group);
        if (fmt == FMT_KQUANT && group != 32) TFAIL(EF_E_INDEX, "bad K-quant group size %u (32)", group);
#undef TFAIL
    }
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
    for (uint32_t i = 0; i < n; i++) {
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
