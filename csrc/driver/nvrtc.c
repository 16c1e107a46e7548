/* SPDX-License-Identifier: MIT */
/*
 * nvrtc.c: NVRTC, loaded at run time, and compilation through a disk
 * cache.
 *
 * Owns the NVRTC function table (filled once) and the on-disk cache of
 * compiled images.  A cache entry is named by a 128-bit hash over the
 * source, the options, the name expressions, the target architecture, the
 * output kind and NVRTC's version; it stores the image and the lowered
 * names of the name expressions.  The directory is CUDAMEM_CACHE_DIR, else
 * $XDG_CACHE_HOME/cudamem, else ~/.cache/cudamem; entries are written
 * atomically (a temporary file, then rename), so concurrent processes
 * never read a partial image.
 *
 * Locks and the GIL: no lock, and nothing here releases the GIL itself.
 * The table is filled with the GIL held and read-only afterwards;
 * cm_nvrtc_compile_nogil touches only its arguments, the table and the
 * cache's files, no Python object, so its callers (features/compile.c,
 * array/kernels.c) run it with the GIL released.
 */
#include "driver/driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* NVRTC's types and result codes as far as cudamem uses them, with the
 * values of its ABI: the library is loaded at run time, so the build
 * needs no NVRTC header (NVIDIA's header-only distributions do not ship
 * one). */
typedef enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_INVALID_OPTION = 5,
} nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

/* The NVRTC entry points cudamem uses. */
typedef struct {
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *,
                                 int, const char *const *,
                                 const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*AddNameExpression)(nvrtcProgram, const char *);
    nvrtcResult (*GetLoweredName)(nvrtcProgram, const char *,
                                  const char **);
    const char *(*GetErrorString)(nvrtcResult);
} cm_nvrtc_table;

static cm_nvrtc_table cm_nvrtc;       /* filled once, GIL held */
static int cm_nvrtc_tried;            /* a load was attempted */
static int cm_nvrtc_major;            /* NVRTC version, for cache keys */
static int cm_nvrtc_minor;
static char cm_nvrtc_error[512];      /* why loading failed */

/* Try one library path; 0 when every entry point was found. */
static int
cm_nvrtc_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);

    if (h == NULL) {
        return -1;
    }
#define CM_NVRTC_SYM(field, name)                                       \
    *(void **)&cm_nvrtc.field = dlsym(h, name);                         \
    if (cm_nvrtc.field == NULL) {                                       \
        goto err_close;                                                 \
    }
    CM_NVRTC_SYM(Version, "nvrtcVersion")
    CM_NVRTC_SYM(CreateProgram, "nvrtcCreateProgram")
    CM_NVRTC_SYM(DestroyProgram, "nvrtcDestroyProgram")
    CM_NVRTC_SYM(CompileProgram, "nvrtcCompileProgram")
    CM_NVRTC_SYM(GetProgramLogSize, "nvrtcGetProgramLogSize")
    CM_NVRTC_SYM(GetProgramLog, "nvrtcGetProgramLog")
    CM_NVRTC_SYM(GetCUBINSize, "nvrtcGetCUBINSize")
    CM_NVRTC_SYM(GetCUBIN, "nvrtcGetCUBIN")
    CM_NVRTC_SYM(GetPTXSize, "nvrtcGetPTXSize")
    CM_NVRTC_SYM(GetPTX, "nvrtcGetPTX")
    CM_NVRTC_SYM(AddNameExpression, "nvrtcAddNameExpression")
    CM_NVRTC_SYM(GetLoweredName, "nvrtcGetLoweredName")
    CM_NVRTC_SYM(GetErrorString, "nvrtcGetErrorString")
#undef CM_NVRTC_SYM
    if (cm_nvrtc.Version(&cm_nvrtc_major, &cm_nvrtc_minor)
        != NVRTC_SUCCESS) {
        goto err_close;
    }
    return 0;

err_close:
    memset(&cm_nvrtc, 0, sizeof(cm_nvrtc));
    dlclose(h);
    return -1;
}

/* The first of CUDA_HOME, CUDA_PATH and /usr/local/cuda that is set, in
 * order, into roots[0..3); the count. */
static int
cm_cuda_roots(const char *roots[3])
{
    const char *cand[3];
    int i;
    int n = 0;

    cand[0] = getenv("CUDA_HOME");
    cand[1] = getenv("CUDA_PATH");
    cand[2] = "/usr/local/cuda";
    for (i = 0; i < 3; i++) {
        if (cand[i] != NULL && cand[i][0] != '\0') {
            roots[n++] = cand[i];
        }
    }
    return n;
}

int
cm_nvrtc_ensure(void)
{
    static const char *const names[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
        "libnvrtc.so", NULL};
    const char *env = getenv("CUDAMEM_NVRTC_LIBRARY");
    const char *roots[3];
    char path[1024];
    int nroots;
    int i;
    int ok = -1;

    if (cm_nvrtc.CompileProgram != NULL) {
        return 0;
    }
    if (!cm_nvrtc_tried) {
        cm_nvrtc_tried = 1;
        if (env != NULL && env[0] != '\0') {
            ok = cm_nvrtc_open(env);
        }
        else {
            for (i = 0; ok < 0 && names[i] != NULL; i++) {
                ok = cm_nvrtc_open(names[i]);
            }
            nroots = cm_cuda_roots(roots);
            for (i = 0; ok < 0 && i < nroots; i++) {
                snprintf(path, sizeof(path), "%s/lib64/libnvrtc.so",
                         roots[i]);
                ok = cm_nvrtc_open(path);
            }
        }
        if (ok < 0) {
            snprintf(cm_nvrtc_error, sizeof(cm_nvrtc_error),
                     "NVRTC could not be loaded (tried %s): cudamem "
                     "compiles CUDA C kernels with it. Install the CUDA "
                     "Toolkit's NVRTC, or point CUDA_HOME or "
                     "CUDAMEM_NVRTC_LIBRARY at it.",
                     env != NULL && env[0] != '\0'
                         ? env : "libnvrtc.so.13/.12/.11.2 and CUDA_HOME");
        }
    }
    if (cm_nvrtc.CompileProgram == NULL) {
        CM_RAISE(CudaSupportError, "%s", cm_nvrtc_error);
        return -1;
    }
    return 0;
}

void
cm_nvrtc_version(int *major, int *minor)
{
    *major = cm_nvrtc_major;
    *minor = cm_nvrtc_minor;
}

int
cm_nvrtc_include_dir(char *buf, size_t n)
{
    const char *roots[3];
    char probe[1100];
    struct stat sb;
    int nroots = cm_cuda_roots(roots);
    int i;

    for (i = 0; i < nroots; i++) {
        snprintf(probe, sizeof(probe), "%s/include/cuda_runtime.h",
                 roots[i]);
        if (stat(probe, &sb) == 0) {
            snprintf(buf, n, "%s/include", roots[i]);
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* The disk cache                                                      */
/* ------------------------------------------------------------------ */

/* Two 64-bit hashes over the same bytes, together the cache key. */
typedef struct {
    uint64_t a;    /* FNV-1a */
    uint64_t b;    /* a multiply-xorshift mix */
} cm_hash;

static void
cm_hash_add(cm_hash *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    size_t i;

    for (i = 0; i < n; i++) {
        h->a ^= p[i];
        h->a *= 1099511628211ULL;
        h->b = (h->b ^ p[i]) * 0x9E3779B97F4A7C15ULL;
        h->b ^= h->b >> 29;
    }
}

/* Add a string and its terminator, so ("ab", "c") differs from
 * ("a", "bc"). */
static void
cm_hash_str(cm_hash *h, const char *s)
{
    cm_hash_add(h, s, strlen(s) + 1);
}

/* The cache directory into buf, created if needed; 0 or -1 (no cache). */
static int
cm_cache_dir(char *buf, size_t n)
{
    const char *d = getenv("CUDAMEM_CACHE_DIR");
    const char *home;
    char *p;

    if (d != NULL && d[0] != '\0') {
        snprintf(buf, n, "%s", d);
    }
    else if ((d = getenv("XDG_CACHE_HOME")) != NULL && d[0] != '\0') {
        snprintf(buf, n, "%s/cudamem", d);
    }
    else if ((home = getenv("HOME")) != NULL && home[0] != '\0') {
        snprintf(buf, n, "%s/.cache/cudamem", home);
    }
    else {
        return -1;
    }
    for (p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) < 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) {
        return -1;
    }
    return 0;
}

/* Read a whole file into a malloc'd buffer; NULL if absent or empty. */
static char *
cm_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0
        || fseek(f, 0, SEEK_SET) != 0) {
        goto out_close;
    }
    buf = malloc((size_t)n);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    *size = (size_t)n;
out_close:
    fclose(f);
    return buf;
}

/* Write a file atomically (temporary name, then rename); best effort. */
static void
cm_write_file(const char *path, const char *data, size_t size)
{
    char tmp[1300];
    FILE *f;
    int ok;

    if (snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid())
        >= (int)sizeof(tmp)) {
        return;
    }
    f = fopen(tmp, "wb");
    if (f == NULL) {
        return;
    }
    ok = fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
    }
}

/*
 * A cache entry: "CMNVRTC2", u32 is_ptx, u32 n_names, per name u32 length
 * and its bytes, u64 length of the kept PTX and its bytes, then the image
 * to the end of the file.
 */
static const char cm_cache_magic[8] = {'C', 'M', 'N', 'V', 'R', 'T', 'C',
                                       '2'};

/* Fill res from a cache entry; 0, or -1 if the entry is not usable. */
static int
cm_cache_decode(const char *buf, size_t size, int n_names,
                cm_nvrtc_result *res)
{
    size_t pos = sizeof(cm_cache_magic) + 8;
    uint32_t is_ptx;
    uint32_t n;
    uint32_t len;
    uint64_t plen;
    int i;

    if (size < pos || memcmp(buf, cm_cache_magic, 8) != 0) {
        return -1;
    }
    memcpy(&is_ptx, buf + 8, 4);
    memcpy(&n, buf + 12, 4);
    if ((int)n != n_names) {
        return -1;
    }
    if (n_names > 0) {
        res->lowered = calloc((size_t)n_names, sizeof(char *));
        if (res->lowered == NULL) {
            return -1;
        }
    }
    for (i = 0; i < n_names; i++) {
        if (size - pos < 4) {
            return -1;
        }
        memcpy(&len, buf + pos, 4);
        pos += 4;
        if (size - pos < len || (res->lowered[i] = malloc(len + 1))
                                    == NULL) {
            return -1;
        }
        memcpy(res->lowered[i], buf + pos, len);
        res->lowered[i][len] = '\0';
        pos += len;
    }
    if (size - pos < 8) {
        return -1;
    }
    memcpy(&plen, buf + pos, 8);
    pos += 8;
    if (plen > 0) {
        if (size - pos < plen || (res->ptx = malloc(plen + 1)) == NULL) {
            return -1;
        }
        memcpy(res->ptx, buf + pos, plen);
        res->ptx[plen] = '\0';
        pos += plen;
    }
    if (size == pos || (res->image = malloc(size - pos + 1)) == NULL) {
        return -1;
    }
    memcpy(res->image, buf + pos, size - pos);
    res->image[size - pos] = '\0';
    res->size = size - pos;
    res->is_ptx = (int)is_ptx;
    return 0;
}

/* Write res as a cache entry at path; best effort. */
static void
cm_cache_store(const char *path, const cm_nvrtc_result *res, int n_names)
{
    uint64_t plen = res->ptx != NULL ? strlen(res->ptx) : 0;
    size_t total = sizeof(cm_cache_magic) + 8 + 8 + plen + res->size;
    uint32_t u;
    char *buf;
    size_t pos;
    int i;

    for (i = 0; i < n_names; i++) {
        total += 4 + strlen(res->lowered[i]);
    }
    buf = malloc(total);
    if (buf == NULL) {
        return;
    }
    memcpy(buf, cm_cache_magic, 8);
    u = (uint32_t)res->is_ptx;
    memcpy(buf + 8, &u, 4);
    u = (uint32_t)n_names;
    memcpy(buf + 12, &u, 4);
    pos = 16;
    for (i = 0; i < n_names; i++) {
        u = (uint32_t)strlen(res->lowered[i]);
        memcpy(buf + pos, &u, 4);
        memcpy(buf + pos + 4, res->lowered[i], u);
        pos += 4 + u;
    }
    memcpy(buf + pos, &plen, 8);
    if (plen > 0) {
        memcpy(buf + pos + 8, res->ptx, plen);
    }
    pos += 8 + plen;
    memcpy(buf + pos, res->image, res->size);
    cm_write_file(path, buf, total);
    free(buf);
}

void
cm_nvrtc_result_clear(cm_nvrtc_result *res, int n_names)
{
    int i;

    free(res->image);
    free(res->ptx);
    free(res->log);
    if (res->lowered != NULL) {
        for (i = 0; i < n_names; i++) {
            free(res->lowered[i]);
        }
        free(res->lowered);
    }
    memset(res, 0, sizeof(*res));
}

/* ------------------------------------------------------------------ */
/* Compilation                                                         */
/* ------------------------------------------------------------------ */

/* res->error and res->log (the program's log, if any) for status rc. */
static void
cm_take_log(nvrtcProgram prog, nvrtcResult rc, cm_nvrtc_result *res)
{
    size_t n = 0;

    res->error = cm_nvrtc.GetErrorString(rc);
    free(res->log);
    res->log = NULL;
    if (prog == NULL
        || cm_nvrtc.GetProgramLogSize(prog, &n) != NVRTC_SUCCESS
        || n <= 1 || (res->log = malloc(n + 1)) == NULL) {
        return;
    }
    if (cm_nvrtc.GetProgramLog(prog, res->log) != NVRTC_SUCCESS) {
        res->log[0] = '\0';
    }
    res->log[n] = '\0';
}

/* The PTX of a compiled program, malloc'd and NUL-terminated; NULL if
 * out of memory or unavailable. */
static char *
cm_get_ptx(nvrtcProgram prog)
{
    size_t n = 0;
    char *p;

    if (cm_nvrtc.GetPTXSize(prog, &n) != NVRTC_SUCCESS
        || (p = malloc(n + 1)) == NULL) {
        return NULL;
    }
    if (cm_nvrtc.GetPTX(prog, p) != NVRTC_SUCCESS) {
        free(p);
        return NULL;
    }
    p[n] = '\0';
    return p;
}

/* One compilation for one architecture option; the status. */
static int
cm_compile_once(const cm_nvrtc_req *req, const char *arch, int ptx,
                cm_nvrtc_result *res, int *invalid_arch)
{
    const char **opts;
    nvrtcProgram prog = NULL;
    nvrtcResult rc;
    const char *lowered;
    int status = CM_NVRTC_ENOMEM;
    int nopts = 0;
    int i;

    *invalid_arch = 0;
    opts = malloc(((size_t)req->n_opts + 1) * sizeof(char *));
    if (opts == NULL) {
        return CM_NVRTC_ENOMEM;
    }
    opts[nopts++] = arch;
    for (i = 0; i < req->n_opts; i++) {
        opts[nopts++] = req->opts[i];
    }
    rc = cm_nvrtc.CreateProgram(&prog, req->src, req->name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        prog = NULL;
        goto out_fail;
    }
    for (i = 0; i < req->n_names; i++) {
        rc = cm_nvrtc.AddNameExpression(prog, req->names[i]);
        if (rc != NVRTC_SUCCESS) {
            goto out_fail;
        }
    }
    rc = cm_nvrtc.CompileProgram(prog, nopts, opts);
    if (rc != NVRTC_SUCCESS) {
        *invalid_arch = rc == NVRTC_ERROR_INVALID_OPTION;
        goto out_fail;
    }
    if (req->n_names > 0) {
        res->lowered = calloc((size_t)req->n_names, sizeof(char *));
        if (res->lowered == NULL) {
            goto out_destroy;
        }
    }
    for (i = 0; i < req->n_names; i++) {
        rc = cm_nvrtc.GetLoweredName(prog, req->names[i], &lowered);
        if (rc != NVRTC_SUCCESS) {
            goto out_fail;
        }
        if ((res->lowered[i] = strdup(lowered)) == NULL) {
            goto out_destroy;
        }
    }
    rc = ptx ? cm_nvrtc.GetPTXSize(prog, &res->size)
             : cm_nvrtc.GetCUBINSize(prog, &res->size);
    if (rc != NVRTC_SUCCESS) {
        goto out_fail;
    }
    if ((res->image = malloc(res->size + 1)) == NULL) {
        goto out_destroy;
    }
    rc = ptx ? cm_nvrtc.GetPTX(prog, res->image)
             : cm_nvrtc.GetCUBIN(prog, res->image);
    if (rc != NVRTC_SUCCESS) {
        goto out_fail;
    }
    res->image[res->size] = '\0';
    res->is_ptx = ptx;
    if (req->keep_ptx && (res->ptx = cm_get_ptx(prog)) == NULL) {
        goto out_destroy;
    }
    status = CM_NVRTC_OK;
    goto out_destroy;

out_fail:
    status = rc == NVRTC_ERROR_OUT_OF_MEMORY ? CM_NVRTC_ENOMEM
                                             : CM_NVRTC_EFAIL;
    if (status == CM_NVRTC_EFAIL) {
        cm_take_log(prog, rc, res);
    }
out_destroy:
    if (prog != NULL) {
        cm_nvrtc.DestroyProgram(&prog);
    }
    free(opts);
    return status;
}

int
cm_nvrtc_compile_nogil(const cm_nvrtc_req *req, cm_nvrtc_result *res)
{
    char cache[1024];
    char path[1200];
    char arch[64];
    char *buf;
    size_t size = 0;
    cm_hash h = {1469598103934665603ULL, 0x243F6A8885A308D3ULL};
    int have_cache;
    int ptx;
    int invalid_arch = 0;
    int status = CM_NVRTC_EFAIL;
    int i;

    memset(res, 0, sizeof(*res));
    cm_hash_str(&h, req->src);
    cm_hash_str(&h, req->name);
    for (i = 0; i < req->n_opts; i++) {
        cm_hash_str(&h, req->opts[i]);
    }
    cm_hash_str(&h, "--names--");
    for (i = 0; i < req->n_names; i++) {
        cm_hash_str(&h, req->names[i]);
    }
    snprintf(arch, sizeof(arch), "%d.%d/%d.%d/%d%d", req->major,
             req->minor, cm_nvrtc_major, cm_nvrtc_minor, req->want_ptx,
             req->keep_ptx);
    cm_hash_str(&h, arch);
    have_cache = cm_cache_dir(cache, sizeof(cache)) == 0;
    if (have_cache) {
        snprintf(path, sizeof(path), "%s/kernel-%016llx%016llx.bin", cache,
                 (unsigned long long)h.a, (unsigned long long)h.b);
        buf = cm_read_file(path, &size);
        if (buf != NULL) {
            status = cm_cache_decode(buf, size, req->n_names, res);
            free(buf);
            if (status == 0) {
                return CM_NVRTC_OK;
            }
            cm_nvrtc_result_clear(res, req->n_names);
        }
    }
    /* A cubin for the exact architecture; PTX for its virtual one when
     * asked, or when this NVRTC does not know the architecture. */
    for (ptx = req->want_ptx; ptx < 2; ptx++) {
        snprintf(arch, sizeof(arch), "--gpu-architecture=%s_%d%d",
                 ptx ? "compute" : "sm", req->major, req->minor);
        status = cm_compile_once(req, arch, ptx, res, &invalid_arch);
        if (status == CM_NVRTC_OK || !invalid_arch || ptx == 1) {
            break;
        }
        cm_nvrtc_result_clear(res, req->n_names);
    }
    if (status == CM_NVRTC_OK && have_cache) {
        cm_cache_store(path, res, req->n_names);
    }
    return status;
}
