/* SGLang's SHA-256 page chain in one call per node (see page_chain.py for the layout).
 *
 * Self-contained: a portable SHA-256 and, on x86-64 CPUs with the SHA extensions, a
 * compression function using them (chosen at import time). No library beyond Python's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHANI_PATH 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define MAX_HASHABLE_TOKEN_ID 9223372036854775807ULL
#define RANGE_ERROR "token ids must be integers in [0, 9223372036854775807]"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void blocks_portable(uint32_t s[8], const uint8_t *p, size_t n) {
    uint32_t w[64];
    while (n--) {
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
                   (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) +
                          K[i] + w[i];
            uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g;
            g = f;
            f = e;
            e = d + t1;
            d = c;
            c = b;
            b = a;
            a = t1 + t2;
        }
        s[0] += a;
        s[1] += b;
        s[2] += c;
        s[3] += d;
        s[4] += e;
        s[5] += f;
        s[6] += g;
        s[7] += h;
        p += 64;
    }
}

#ifdef HAVE_SHANI_PATH
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t s[8],
                                                                      const uint8_t *p,
                                                                      size_t n) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&s[0]);
    __m128i st1 = _mm_loadu_si128((const __m128i *)&s[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);
    st1 = _mm_shuffle_epi32(st1, 0x1B);
    __m128i st0 = _mm_alignr_epi8(tmp, st1, 8); /* ABEF */
    st1 = _mm_blend_epi16(st1, tmp, 0xF0);      /* CDGH */
    while (n--) {
        __m128i abef = st0, cdgh = st1, w[4];
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 16
#elif defined(__clang__)
#pragma unroll
#endif
        for (int i = 0; i < 16; i++) {
            __m128i m;
            if (i < 4) {
                m = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), mask);
            } else {
                m = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
                m = _mm_add_epi32(m, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
                m = _mm_sha256msg2_epu32(m, w[(i + 3) & 3]);
            }
            w[i & 3] = m;
            __m128i r = _mm_add_epi32(m, _mm_loadu_si128((const __m128i *)&K[4 * i]));
            st1 = _mm_sha256rnds2_epu32(st1, st0, r);
            st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(r, 0x0E));
        }
        st0 = _mm_add_epi32(st0, abef);
        st1 = _mm_add_epi32(st1, cdgh);
        p += 64;
    }
    tmp = _mm_shuffle_epi32(st0, 0x1B);
    st1 = _mm_shuffle_epi32(st1, 0xB1);
    st0 = _mm_blend_epi16(tmp, st1, 0xF0);
    st1 = _mm_alignr_epi8(st1, tmp, 8);
    _mm_storeu_si128((__m128i *)&s[0], st0);
    _mm_storeu_si128((__m128i *)&s[4], st1);
}

static int cpu_has_shani(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 19)) || !(c & (1u << 9))) return 0; /* SSE4.1, SSSE3 */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 29) & 1; /* SHA */
}
#endif

typedef void (*blocks_fn)(uint32_t *, const uint8_t *, size_t);
static blocks_fn compress = blocks_portable;

typedef struct {
    uint32_t s[8];
    uint8_t buf[64];
    size_t fill;
    uint64_t total;
} Sha256;

static void sha_init(Sha256 *c) {
    memcpy(c->s, H0, sizeof H0);
    c->fill = 0;
    c->total = 0;
}

static void sha_update(Sha256 *c, const uint8_t *p, size_t n) {
    c->total += n;
    if (c->fill) {
        size_t take = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->buf + c->fill, p, take);
        c->fill += take;
        p += take;
        n -= take;
        if (c->fill < 64) return;
        compress(c->s, c->buf, 1);
        c->fill = 0;
    }
    if (n >= 64) {
        compress(c->s, p, n / 64);
        p += n - n % 64;
        n %= 64;
    }
    memcpy(c->buf, p, n);
    c->fill = n;
}

static void sha_final(Sha256 *c, uint8_t out[32]) {
    uint64_t bits = c->total * 8;
    c->buf[c->fill++] = 0x80;
    if (c->fill > 56) {
        memset(c->buf + c->fill, 0, 64 - c->fill);
        compress(c->s, c->buf, 1);
        c->fill = 0;
    }
    memset(c->buf + c->fill, 0, 56 - c->fill);
    for (int i = 0; i < 8; i++) c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(c->s, c->buf, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->s[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->s[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->s[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->s[i];
    }
}

/* One page: SHA-256(prior (0 or 32 bytes) + tag (0 or 1 byte) + data) into out. */
static void hash_page(const uint8_t *prior, size_t prior_len, int wide, const uint8_t *data,
                      size_t len, uint8_t out[32]) {
    Sha256 c;
    sha_init(&c);
    if (prior_len) sha_update(&c, prior, prior_len);
    if (wide) {
        const uint8_t tag = 0xff;
        sha_update(&c, &tag, 1);
    }
    sha_update(&c, data, len);
    sha_final(&c, out);
}

static int check_prior(Py_buffer *prior) {
    if (prior->len != 0 && prior->len != 32) {
        PyErr_Format(PyExc_ValueError, "the prior digest must be empty or 32 bytes, got %zd",
                     prior->len);
        return -1;
    }
    return 0;
}

static PyObject *chain_packed(PyObject *self, PyObject *args) {
    Py_buffer prior, raw;
    Py_ssize_t page_bytes;
    if (!PyArg_ParseTuple(args, "y*y*n:chain_packed", &prior, &raw, &page_bytes)) return NULL;
    PyObject *result = NULL;
    if (check_prior(&prior) < 0) goto done;
    if (page_bytes < 1) {
        PyErr_Format(PyExc_ValueError, "page_bytes must be >= 1, got %zd", page_bytes);
        goto done;
    }
    Py_ssize_t pages = raw.len / page_bytes;
    result = PyBytes_FromStringAndSize(NULL, 32 * pages);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *data = (const uint8_t *)raw.buf;
    const uint8_t *prev = (const uint8_t *)prior.buf;
    size_t prev_len = (size_t)prior.len;
    for (Py_ssize_t i = 0; i < pages; i++) {
        hash_page(prev, prev_len, 0, data + i * page_bytes, (size_t)page_bytes, out + 32 * i);
        prev = out + 32 * i;
        prev_len = 32;
    }
done:
    PyBuffer_Release(&prior);
    PyBuffer_Release(&raw);
    return result;
}

/* The id at ``item`` as an unsigned 64-bit value in [0, 2**63 - 1]; -1 with ValueError set. */
static int read_id(PyObject *item, uint64_t *value) {
    if (!PyLong_Check(item) || PyBool_Check(item)) goto bad;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow || v < 0) goto bad;
    if (v == -1 && PyErr_Occurred()) return -1;
    *value = (uint64_t)v;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, RANGE_ERROR);
    return -1;
}

static PyObject *chain_ids(PyObject *self, PyObject *args) {
    Py_buffer prior;
    PyObject *ids;
    Py_ssize_t page_size;
    if (!PyArg_ParseTuple(args, "y*On:chain_ids", &prior, &ids, &page_size)) return NULL;
    PyObject *result = NULL, *seq = NULL;
    uint64_t *values = NULL;
    uint8_t *page = NULL;
    if (check_prior(&prior) < 0) goto done;
    if (page_size < 1) {
        PyErr_Format(PyExc_ValueError, "page_size must be >= 1, got %zd", page_size);
        goto done;
    }
    seq = PySequence_Fast(ids, "token ids must be a sequence of integers");
    if (seq == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    values = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    page = PyMem_Malloc(8 * (size_t)page_size);
    if (values == NULL || page == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (read_id(items[i], &values[i]) < 0) goto done;
    Py_ssize_t pages = n / page_size;
    result = PyBytes_FromStringAndSize(NULL, 32 * pages);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *prev = (const uint8_t *)prior.buf;
    size_t prev_len = (size_t)prior.len;
    for (Py_ssize_t p = 0; p < pages; p++) {
        const uint64_t *v = values + p * page_size;
        int wide = 0;
        for (Py_ssize_t i = 0; i < page_size; i++) wide |= v[i] > 0xffffffffULL;
        size_t width = wide ? 8 : 4;
        if (wide) {
            for (Py_ssize_t i = 0; i < page_size; i++)
                for (size_t b = 0; b < 8; b++) page[8 * i + b] = (uint8_t)(v[i] >> (8 * b));
        } else {
            for (Py_ssize_t i = 0; i < page_size; i++) {
                uint32_t x = (uint32_t)v[i];
                page[4 * i] = (uint8_t)x;
                page[4 * i + 1] = (uint8_t)(x >> 8);
                page[4 * i + 2] = (uint8_t)(x >> 16);
                page[4 * i + 3] = (uint8_t)(x >> 24);
            }
        }
        hash_page(prev, prev_len, wide, page, width * page_size, out + 32 * p);
        prev = out + 32 * p;
        prev_len = 32;
    }
done:
    if (PyErr_Occurred()) Py_CLEAR(result);
    PyMem_Free(values);
    PyMem_Free(page);
    Py_XDECREF(seq);
    PyBuffer_Release(&prior);
    return result;
}

/* The ids of a list or tuple as 4-byte little-endian values, or None when one is not an int
 * (exactly) in [0, 2**32 - 1]: the caller then takes its general path. */
static PyObject *pack_u32(PyObject *self, PyObject *ids) {
    if (!PyList_Check(ids) && !PyTuple_Check(ids)) Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(ids, "token ids must be a sequence of integers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    /* No Python code runs in the loop: the list cannot change under it. */
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        int overflow = 0;
        long long v = PyLong_CheckExact(item) ? PyLong_AsLongLongAndOverflow(item, &overflow) : -1;
        if (overflow || v < 0 || v > 0xffffffffLL) {
            PyErr_Clear();
            Py_CLEAR(result);
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        uint32_t x = (uint32_t)v;
        out[4 * i] = (uint8_t)x;
        out[4 * i + 1] = (uint8_t)(x >> 8);
        out[4 * i + 2] = (uint8_t)(x >> 16);
        out[4 * i + 3] = (uint8_t)(x >> 24);
    }
done:
    Py_DECREF(seq);
    return result;
}

static PyObject *implementation(PyObject *self, PyObject *noargs) {
    return PyUnicode_FromString(compress == blocks_portable ? "portable" : "sha-ni");
}

static PyObject *use_portable(PyObject *self, PyObject *arg) {
    int portable = PyObject_IsTrue(arg);
    if (portable < 0) return NULL;
    compress = blocks_portable;
#ifdef HAVE_SHANI_PATH
    if (!portable && cpu_has_shani()) compress = blocks_shani;
#endif
    return implementation(self, NULL);
}

static PyMethodDef methods[] = {
    {"chain_packed", chain_packed, METH_VARARGS,
     "chain_packed(prior, raw, page_bytes) -> the chained digests of raw's full pages"},
    {"chain_ids", chain_ids, METH_VARARGS,
     "chain_ids(prior, token_ids, page_size) -> the chained digests of the ids' full pages"},
    {"pack_u32", pack_u32, METH_O,
     "pack_u32(ids) -> the ids as 4-byte little-endian bytes, or None if one is not an int "
     "in [0, 2**32 - 1]"},
    {"implementation", implementation, METH_NOARGS,
     "implementation() -> 'sha-ni' or 'portable': the SHA-256 compression in use"},
    {"use_portable", use_portable, METH_O,
     "use_portable(flag) -> force the portable compression (True) or the fastest (False)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_page_chain",
                                    "SGLang's SHA-256 page chain, native.", -1, methods};

PyMODINIT_FUNC PyInit__page_chain(void) {
#ifdef HAVE_SHANI_PATH
    if (cpu_has_shani()) compress = blocks_shani;
#endif
    return PyModule_Create(&module);
}
