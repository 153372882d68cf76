/* The fused CPU pass of compare() for float16, bfloat16 and float32 tensors.
 *
 * One sweep per block of BLOCK elements (the block stays in L1 between its two passes):
 *   pass 1: cast to float32, d = |e - g|, lane max / sum of d, max ULP distance of the bit patterns,
 *           and a finiteness test (every NaN/Inf input, and every float32 overflow of e - g, makes d
 *           non-finite);
 *   pass 2: for the thresholds below the block's max, the count of d > t; the relative error
 *           d / max(|e|, tiny) (float64) of the candidates that could beat the running maximum; the
 *           allclose count d > atol + rtol*|e| (float64) when the block's max exceeds atol.
 * A block holding a non-finite d is not counted here: its start is returned, and Python applies the
 * NaN/Inf rules to it (diff.py, _exact_chunk). Every count and maximum is exact and equals the numpy
 * path's; only the float32 lane sums of d (mean_abs) differ from it in summation order.
 *
 * The loops use GCC/clang vector extensions over VL independent lanes, so nothing is reassociated
 * but the lane sums; the file must be compiled without floating-point contraction
 * (-ffp-contract=off: atol + rtol*|e| is two roundings, as in numpy). On x86-64 Linux with GCC the
 * block functions are cloned for AVX-512 and AVX2, picked at load time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 4096

#if !defined(__GNUC__)
#error "the fused pass needs GCC or clang vector extensions; without them diff.py takes its numpy path"
#endif
#if defined(__FAST_MATH__)
#error "-ffast-math would drop the NaN/Inf tests and reorder the float64 tolerance; build without it"
#endif
/* clones only when the base target lacks AVX-512 (GCC 12 fails on a v3 clone under -march=x86-64-v4) */
#if !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && __GNUC__ >= 12 && \
    !defined(__AVX512F__) /* (ifunc: glibc only, not musl) */
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

enum { KIND_F32 = 0, KIND_F16 = 1, KIND_BF16 = 2 };

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* IEEE half -> float, exact (subnormals through an int -> float conversion, so DAZ/FTZ modes do not
 * matter; Inf and NaN keep their class). */
static inline float half_to_float(uint16_t h) {
    uint32_t em = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t sub = float_to_bits((float)(int32_t)em * 0x1p-24f);
    uint32_t normal = (em << 13) + (112u << 23);
    uint32_t special = (em << 13) | 0x7f800000u;
    uint32_t bits = em < 0x0400u ? sub : (em >= 0x7c00u ? special : normal);
    return bits_to_float(bits | sign);
}

/* signed position of a sign-magnitude 16-bit pattern on the number line (-0 and +0 both 0) */
static inline int32_t ordered16(uint16_t h) {
    int32_t mag = (int32_t)(h & 0x7fffu);
    return (h & 0x8000u) ? -mag : mag;
}

static inline int32_t ordered32(uint32_t b) {
    int32_t mag = (int32_t)(b & 0x7fffffffu);
    return (b & 0x80000000u) ? -mag : mag;
}

static inline uint32_t distance(int32_t a, int32_t b) {
    /* |a - b| < 2**32 for the ordered patterns of two finite floats */
    return a >= b ? (uint32_t)a - (uint32_t)b : (uint32_t)b - (uint32_t)a;
}

typedef struct {
    const float *thr; /* thresholds, ascending, in float32 rounded down */
    Py_ssize_t nthr;
    int64_t *counts;
    int has_tol;
    double atol, rtol;
    float atol_work; /* d > atol_work <=> d > atol for float32 d */
    float tiny;
    double sum_abs, max_abs, max_rel, max_ulp;
    int64_t argmax, oot;
    int64_t *exact; /* starts of the blocks left to Python */
    Py_ssize_t nexact;
} Acc;

/* ---- SIMD: GCC/clang vector extensions, VL lanes (one AVX-512 register; two AVX2 ones, four SSE2) */
#define VL 16
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int64_t vl8 __attribute__((vector_size(64)));

#define INLINE static inline __attribute__((always_inline))

INLINE vf load_f(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
INLINE vu load_u(const uint32_t *p) { vu v; memcpy(&v, p, sizeof v); return v; }
INLINE vi load_h(const uint16_t *p) { vh v; memcpy(&v, p, sizeof v); return __builtin_convertvector(v, vi); }
INLINE void store_f(float *p, vf v) { memcpy(p, &v, sizeof v); }
INLINE vi sel_i(vi m, vi a, vi b) { return (m & a) | (~m & b); }
INLINE vf sel_f(vi m, vf a, vf b) { return (vf)sel_i(m, (vi)a, (vi)b); }
INLINE vf splat(float x) { vf v = {0}; return v + x; }
INLINE vf vabs(vf x) { return (vf)((vi)x & 0x7fffffff); }

INLINE vf vhalf_to_float(vi h) {
    vi em = h & 0x7fff;
    vi sign = (vi)((vu)(h & 0x8000) << 16); /* shifts into the sign bit: unsigned */
    vi sub = (vi)(__builtin_convertvector(em, vf) * 0x1p-24f);
    vi normal = (em << 13) + (112 << 23);
    vi special = (em << 13) | 0x7f800000;
    return (vf)(sel_i(em < 0x0400, sub, sel_i(em >= 0x7c00, special, normal)) | sign);
}

INLINE vi vordered16(vi h) {
    vi mag = h & 0x7fff;
    return sel_i((h & 0x8000) != 0, -mag, mag);
}

INLINE vi vordered32(vu b) {
    vi mag = (vi)(b & 0x7fffffffu);
    return sel_i((vi)b < 0, -mag, mag);
}

INLINE vu vdistance(vi a, vi b) {
    return (vu)sel_i(a >= b, (vi)((vu)a - (vu)b), (vi)((vu)b - (vu)a));
}

/* the running lane state of pass 1 */
typedef struct {
    vf mx, sm;
    vu um;         /* float32: max ULP distance */
    vi dmax, dmin; /* 16-bit formats: max and min of the signed distance (it fits in 32 bits) */
    vi bad;
} Lanes;

INLINE void pass1_step(Lanes *s, float *ef, float *db, vf e, vf g, vu u) {
    vf d = vabs(e - g);
    if (ef != NULL) store_f(ef, e); /* (NULL: pass 2 reads e from the input itself) */
    store_f(db, d);
    s->bad |= ~(d <= splat(FLT_MAX));
    s->mx = sel_f(d > s->mx, d, s->mx);
    s->sm += d;
    u = (vu)((vi)(d > splat(0.0f)) & (vi)u); /* only pairs that differ (under FTZ/DAZ d can be 0) */
    s->um = (vu)sel_i(u > s->um, (vi)u, (vi)s->um);
}

/* 16-bit formats: the ordered patterns' difference o = ord(e) - ord(g) is exact in int32, so the max
 * ULP distance is max(max o, -min o): two ops instead of an unsigned |o| and a compare-and-select */
INLINE void pass1_step16(Lanes *s, float *ef, float *db, vf e, vf g, vi o) {
    vf d = vabs(e - g);
    store_f(ef, e);
    store_f(db, d);
    s->bad |= ~(d <= splat(FLT_MAX));
    s->mx = sel_f(d > s->mx, d, s->mx);
    s->sm += d;
    o &= (vi)(d > splat(0.0f)); /* only pairs that differ (under FTZ/DAZ d can be 0) */
    s->dmax = sel_i(o > s->dmax, o, s->dmax);
    s->dmin = sel_i(o < s->dmin, o, s->dmin);
}

/* the scalar tail of a block (len not a multiple of VL) folds into lane 0 */
INLINE void tail_step(Lanes *s, float *ef, float *db, float e, float g, uint32_t u) {
    float d = fabsf(e - g);
    *ef = e;
    *db = d;
    s->bad[0] |= !(d <= FLT_MAX);
    s->mx[0] = d > s->mx[0] ? d : s->mx[0];
    s->sm[0] += d;
    u = d > 0.0f ? u : 0;
    s->um[0] = u > s->um[0] ? u : s->um[0];
}

/* pass 2 and the merge of one block into acc (a block with a non-finite d is only recorded) */
INLINE void finish_block(Acc *acc, Py_ssize_t base, Py_ssize_t len, const float *ef, const float *db, const Lanes *s) {
    int32_t any_bad = 0;
    float bmax = 0.0f;
    uint32_t bulp = 0;
    double bsum = 0.0;
    for (int j = 0; j < VL; j++) {
        any_bad |= s->bad[j];
        bmax = s->mx[j] > bmax ? s->mx[j] : bmax;
        bulp = s->um[j] > bulp ? s->um[j] : bulp;
        bulp = (uint32_t)s->dmax[j] > bulp ? (uint32_t)s->dmax[j] : bulp;
        bulp = (uint32_t)-s->dmin[j] > bulp ? (uint32_t)-s->dmin[j] : bulp;
        bsum += (double)s->sm[j];
    }
    if (any_bad) {
        acc->exact[acc->nexact++] = base;
        return;
    }
    if (!(bsum <= DBL_MAX)) { /* a float32 lane sum overflowed: redo the block in float64 */
        bsum = 0.0;
        for (Py_ssize_t i = 0; i < len; i++) bsum += (double)db[i];
    }
    acc->sum_abs += bsum;
    if ((double)bmax > acc->max_abs) {
        Py_ssize_t i = 0;
        while (db[i] != bmax) i++;
        acc->max_abs = (double)bmax;
        acc->argmax = base + i;
    }
    if ((double)bulp > acc->max_ulp) acc->max_ulp = (double)bulp;
    if (bmax == 0.0f) return; /* identical block: nothing above any threshold */
    const Py_ssize_t full = len / VL * VL;

    /* histogram: counts[t] += #(d > t) for the thresholds below the block's max */
    for (Py_ssize_t t = 0; t < acc->nthr && acc->thr[t] < bmax; t++) {
        const float th = acc->thr[t];
        const vf thv = splat(th);
        vi c = {0}, c1 = {0}, c2 = {0}, c3 = {0}; /* four chains: the loop is not latency-bound */
        Py_ssize_t i = 0;
        for (; i + 4 * VL <= full; i += 4 * VL) {
            c -= load_f(db + i) > thv;
            c1 -= load_f(db + i + VL) > thv;
            c2 -= load_f(db + i + 2 * VL) > thv;
            c3 -= load_f(db + i + 3 * VL) > thv;
        }
        for (; i < full; i += VL) c -= load_f(db + i) > thv;
        c += c1 + c2 + c3;
        int64_t total = 0;
        for (Py_ssize_t i = full; i < len; i++) total += db[i] > th;
        for (int j = 0; j < VL; j++) total += c[j];
        acc->counts[t] += total;
    }

    /* relative error: a pair beats the running max r only if d > r * max(|e|, tiny), hence only if
     * d >= fl(rf * a) for a float rf <= r (rounding is monotone): only such blocks get the exact
     * float64 value of every pair */
    {
        double r = acc->max_rel;
        float rf = r > (double)FLT_MAX ? FLT_MAX : (float)r;
        if ((double)rf > r) rf = nextafterf(rf, 0.0f);
        const float tiny = acc->tiny;
        const vf tinyv = splat(tiny), rfv = splat(rf), least = splat(0x1p-149f);
        vi hit = {0};
        for (Py_ssize_t i = 0; i < full; i += VL) {
            vf a = vabs(load_f(ef + i));
            a = sel_f(a < tinyv, tinyv, a);
            vf d = load_f(db + i);
            vf b = rfv * a;
            hit |= d >= sel_f(b < least, least, b); /* d >= the least positive float: d > 0 */
        }
        int32_t any_hit = 0;
        for (Py_ssize_t i = full; i < len; i++) {
            float a = fabsf(ef[i]);
            a = a < tiny ? tiny : a;
            any_hit |= (db[i] > 0.0f) & (db[i] >= rf * a);
        }
        for (int j = 0; j < VL; j++) any_hit |= hit[j];
        if (any_hit) {
            const double dtiny = (double)tiny;
            for (Py_ssize_t k = 0; k < len; k++) {
                if (db[k] > 0.0f) {
                    double a = fabs((double)ef[k]);
                    double rel = (double)db[k] / (a < dtiny ? dtiny : a);
                    if (rel > r) r = rel;
                }
            }
            acc->max_rel = r;
        }
    }

    /* allclose: d > atol + rtol*|e| (in float64), when some d > atol */
    if (acc->has_tol && bmax > acc->atol_work) {
        const double atol = acc->atol, rtol = acc->rtol;
        int64_t total = 0;
        {
            const Py_ssize_t full8 = len / 8 * 8;
            const vd8 atolv = (vd8){0} + atol, rtolv = (vd8){0} + rtol;
            vl8 c = {0};
            for (Py_ssize_t i = 0; i < full8; i += 8) {
                vf8 d8, e8;
                memcpy(&d8, db + i, sizeof d8);
                memcpy(&e8, ef + i, sizeof e8);
                vd8 d = __builtin_convertvector(d8, vd8), e = __builtin_convertvector(e8, vd8);
                vd8 ae = (vd8)((vl8)e & 0x7fffffffffffffffLL);
                c -= d > atolv + rtolv * ae;
            }
            for (Py_ssize_t i = full8; i < len; i++) total += (double)db[i] > atol + rtol * fabs((double)ef[i]);
            for (int j = 0; j < 8; j++) total += c[j];
        }
        acc->oot += total;
    }
}

#define BLOCK_LOOP(E_PASS2, VEC_STEP, SCALAR_STEP)                                                            \
    float ef[BLOCK], db[BLOCK];                                                                      \
    for (Py_ssize_t base = lo; base < hi; base += block) {                                           \
        const Py_ssize_t len = hi - base < block ? hi - base : block;                                \
        const Py_ssize_t full = len / VL * VL;                                                       \
        Lanes s = {{0}, {0}, {0}, {0}, {0}, {0}};                                                              \
        for (Py_ssize_t i = 0; i < full; i += VL) {                                                  \
            const Py_ssize_t k = base + i;                                                           \
            VEC_STEP;                                                                                \
        }                                                                                            \
        for (Py_ssize_t i = full; i < len; i++) {                                                    \
            const Py_ssize_t k = base + i;                                                           \
            SCALAR_STEP;                                                                             \
        }                                                                                            \
        finish_block(acc, base, len, E_PASS2, db, &s);                                                    \
    }

CLONES static void run_f32(Acc *acc, const void *e, const void *g, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t block) {
    const uint32_t *eb = (const uint32_t *)e, *gb = (const uint32_t *)g;
    const float *ep = (const float *)e;
    BLOCK_LOOP(
        ep + base,
        vu ue = load_u(eb + k); vu ug = load_u(gb + k);
        pass1_step(&s, NULL, db + i, (vf)ue, (vf)ug, vdistance(vordered32(ue), vordered32(ug))),
        tail_step(&s, ef + i, db + i, bits_to_float(eb[k]), bits_to_float(gb[k]),
                  distance(ordered32(eb[k]), ordered32(gb[k]))))
}

CLONES static void run_f16(Acc *acc, const void *e, const void *g, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t block) {
    const uint16_t *eh = (const uint16_t *)e, *gh = (const uint16_t *)g;
    BLOCK_LOOP(
        ef,
        vi he = load_h(eh + k); vi hg = load_h(gh + k);
        pass1_step16(&s, ef + i, db + i, vhalf_to_float(he), vhalf_to_float(hg), vordered16(he) - vordered16(hg)),
        tail_step(&s, ef + i, db + i, half_to_float(eh[k]), half_to_float(gh[k]),
                  distance(ordered16(eh[k]), ordered16(gh[k]))))
}

CLONES static void run_bf16(Acc *acc, const void *e, const void *g, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t block) {
    const uint16_t *eh = (const uint16_t *)e, *gh = (const uint16_t *)g;
    BLOCK_LOOP(
        ef,
        vi he = load_h(eh + k); vi hg = load_h(gh + k);
        pass1_step16(&s, ef + i, db + i, (vf)((vu)he << 16), (vf)((vu)hg << 16), vordered16(he) - vordered16(hg)),
        tail_step(&s, ef + i, db + i, bits_to_float((uint32_t)eh[k] << 16), bits_to_float((uint32_t)gh[k] << 16),
                  distance(ordered16(eh[k]), ordered16(gh[k]))))
}

PyDoc_STRVAR(fused_doc,
             "fused(kind, e, g, lo, hi, thresholds, counts, tol, tiny, out, exact, block=BLOCK) -> int\n\n"
             "The statistics of elements [lo, hi) of the flat tensors e and g (buffers of their bit\n"
             "patterns; kind 0 float32, 1 float16, 2 bfloat16). thresholds: float32, ascending (rounded\n"
             "down); counts: int64, added to; tol: None or (atol, rtol, atol_work); out: float64[6], set to\n"
             "sum_abs, max_abs (-1 if no finite block), argmax, max_rel, max_ulp, out-of-tolerance count;\n"
             "exact: int64, receives the starts of the blocks with a non-finite difference. Returns the\n"
             "number of those blocks (each `block` elements long, the last one shorter; 1 <= block <= BLOCK).");

static PyObject *fused(PyObject *self, PyObject *args) {
    int kind;
    Py_buffer e, g, thr, counts, out, exact;
    Py_ssize_t lo, hi, block = BLOCK;
    PyObject *tol;
    float tiny;
    (void)self;
    if (!PyArg_ParseTuple(args, "iy*y*nny*w*Ofw*w*|n", &kind, &e, &g, &lo, &hi, &thr, &counts, &tol, &tiny, &out, &exact,
                          &block))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t width = kind == KIND_F32 ? 4 : 2;
    Py_ssize_t nthr = thr.len / (Py_ssize_t)sizeof(float);
    Acc acc = {0};
    if (block < 1 || block > BLOCK) {
        PyErr_Format(PyExc_ValueError, "block must be in [1, %d], got %zd", BLOCK, block);
        goto done;
    }
    Py_ssize_t nblocks = hi > lo ? (hi - lo) / block + ((hi - lo) % block != 0) : 0;
    if (kind < 0 || kind > 2) {
        PyErr_Format(PyExc_ValueError, "kind must be 0, 1 or 2, got %d", kind);
        goto done;
    }
    /* (divisions, not products: a huge hi must not wrap around) */
    if (lo < 0 || hi < lo || hi > e.len / width || hi > g.len / width || counts.len / 8 < nthr ||
        out.len < 6 * 8 || exact.len / 8 < nblocks) {
        PyErr_SetString(PyExc_ValueError, "fused: a buffer is too small for [lo, hi)");
        goto done;
    }
    acc.thr = (const float *)thr.buf;
    acc.nthr = nthr;
    acc.counts = (int64_t *)counts.buf;
    acc.tiny = tiny;
    acc.max_abs = -1.0;
    acc.exact = (int64_t *)exact.buf;
    if (tol != Py_None) {
        double atol_work;
        if (!PyTuple_Check(tol)) {
            PyErr_SetString(PyExc_TypeError, "tol must be None or a tuple (atol, rtol, atol_work)");
            goto done;
        }
        if (!PyArg_ParseTuple(tol, "ddd", &acc.atol, &acc.rtol, &atol_work)) goto done;
        acc.has_tol = 1;
        acc.atol_work = (float)atol_work;
    }
    Py_BEGIN_ALLOW_THREADS
    if (kind == KIND_F32)
        run_f32(&acc, e.buf, g.buf, lo, hi, block);
    else if (kind == KIND_F16)
        run_f16(&acc, e.buf, g.buf, lo, hi, block);
    else
        run_bf16(&acc, e.buf, g.buf, lo, hi, block);
    Py_END_ALLOW_THREADS
    double *o = (double *)out.buf;
    o[0] = acc.sum_abs;
    o[1] = acc.max_abs;
    o[2] = (double)acc.argmax;
    o[3] = acc.max_rel;
    o[4] = acc.max_ulp;
    o[5] = (double)acc.oot;
    result = PyLong_FromSsize_t(acc.nexact);
done:
    PyBuffer_Release(&e);
    PyBuffer_Release(&g);
    PyBuffer_Release(&thr);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&out);
    PyBuffer_Release(&exact);
    return result;
}

static PyMethodDef methods[] = {
    {"fused", fused, METH_VARARGS, fused_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastdiff", "The fused CPU pass of compare().", -1, methods};

PyMODINIT_FUNC PyInit__fastdiff(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
