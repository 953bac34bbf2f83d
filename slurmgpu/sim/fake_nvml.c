/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for machines without a GPU.
 *
 * Built by slurmgpu.sim.build against NVIDIA's real nvml.h, so the compiler
 * checks every exported prototype.  State comes from the JSON scenario named
 * by $SLURMGPU_SIM_SCENARIO and is re-read whenever the file changes (stat
 * inode/size/mtime/ctime), so a test can inject a fault into a running
 * process by atomically replacing the file.  The format is documented in
 * docs/simulator.md.
 *
 * Conventions:
 *   - a key missing (or null) for a GPU      -> NVML_ERROR_NOT_SUPPORTED
 *   - a key with a value of the wrong type   -> NVML_ERROR_UNKNOWN
 *   - "lost": true on a GPU                  -> NVML_ERROR_GPU_IS_LOST for every call on it
 *   - "hang": true on a GPU                  -> every device call on it blocks until cleared
 *   - "errors": {"<C symbol>": code}         -> that code (per GPU, then top level)
 *   - "init_error": code (top level)         -> nvmlInit* fails with it
 *   - no scenario / unreadable at init       -> NVML_ERROR_DRIVER_NOT_LOADED
 *
 * Driver branches: "driver_version" ("535.183.01") picks a branch profile (see
 * g_since below, from the nvml.h of each branch's CUDA release).  A function newer than
 * the branch answers NVML_ERROR_FUNCTION_NOT_FOUND (as pynvml reports a missing symbol),
 * a struct version newer than the branch answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH, a
 * field id at or past the branch's NVML_FI_MAX answers NVML_ERROR_INVALID_ARGUMENT, and
 * event types the branch does not know are not supported.  An unparsable or missing
 * driver_version behaves as the newest branch.  "missing_functions": [...] (top level)
 * removes more functions, as a recorded node's capability profile does.
 *
 * Clock events: like a real driver, every GPU with nvmlEventTypeClock registered gets
 * clock-change events continuously: "clock_event_hz" {"idle": 10, "load": 35} (the rates
 * measured on an H200; per GPU a number overrides), "load": true on a GPU picks the load
 * rate.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS /* we also export nvmlInit, nvmlEventSetWait, ... */

#include <nvml.h>
#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define SIM_ENV "SLURMGPU_SIM_SCENARIO"
#define MAX_GPUS 64
#define EVENT_POLL_MS 50
#define EVENT_SET_MAGIC 0x5EA7F00DU
#define DEFAULT_EVENT_TYPES                                                                   \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |                        \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)
/* Event types per branch (nvml.h): R535/R550 know 0x9F; R560 adds ECC storm, DRAM
 * retirement and poison (0x200-0x2000); R570 adds GPU unavailable and recovery action. */
#define EVENTS_R535 0x9FULL
#define EVENTS_R560 (EVENTS_R535 | 0x3E00ULL)
#define EVENTS_R570 (EVENTS_R560 | 0xC000ULL)
#define CLOCK_IDLE_HZ 10.0
#define CLOCK_LOAD_HZ 35.0
#define FIELD_MEMORY_TEMP 82        /* NVML_FI_DEV_MEMORY_TEMP */
#define FIELD_PCIE_REPLAY 94        /* NVML_FI_DEV_PCIE_REPLAY_COUNTER */
#define FIELD_RESET_STATUS 226      /* NVML_FI_DEV_RESET_STATUS (deprecated by 230) */
#define FIELD_DRAIN_RESET_STATUS 227 /* NVML_FI_DEV_DRAIN_AND_RESET_STATUS */
#define FIELD_RECOVERY_ACTION 230   /* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION */

/* nvml.h only forward-declares these; handles point into static storage. */
struct nvmlDevice_st {
    unsigned int index;
};

struct nvmlEventSet_st {
    unsigned int magic;
    unsigned long long mask[MAX_GPUS]; /* registered event types per GPU index */
    double clock_due_ms[MAX_GPUS];     /* monotonic ms of the next clock event per GPU */
    double next_clock_ms;              /* earliest of those after the last poll (0: none) */
    long long *delivered;              /* event ids already delivered on this set */
    size_t n_delivered;
    size_t cap_delivered;
};

static struct nvmlDevice_st g_devices[MAX_GPUS];

/* ------------------------------------------------------------------------ */
/* Scenario state                                                            */
/* ------------------------------------------------------------------------ */

struct file_stamp {
    int valid;
    char path[PATH_MAX];
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    struct timespec ctime;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static cJSON *g_root;             /* current scenario, NULL when none loaded */
static int g_init_count;          /* nvmlInit refcount */
static struct file_stamp g_stamp; /* stamp of the file g_root came from */
static struct file_stamp g_bad;   /* last stamp that failed to parse (reported once) */

static void stamp_from_stat(struct file_stamp *s, const char *path, const struct stat *st)
{
    s->valid = 1;
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->dev = st->st_dev;
    s->ino = st->st_ino;
    s->size = st->st_size;
    s->mtime = st->st_mtim;
    s->ctime = st->st_ctim;
}

static int stamp_matches(const struct file_stamp *s, const char *path, const struct stat *st)
{
    return s->valid && strcmp(s->path, path) == 0 && s->dev == st->st_dev &&
           s->ino == st->st_ino && s->size == st->st_size &&
           s->mtime.tv_sec == st->st_mtim.tv_sec && s->mtime.tv_nsec == st->st_mtim.tv_nsec &&
           s->ctime.tv_sec == st->st_ctim.tv_sec && s->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static char *read_whole_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (cap - len < 4096) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nbuf = realloc(buf, ncap + 1);
            if (!nbuf) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nbuf;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                free(buf);
                fclose(f);
                return NULL;
            }
            break;
        }
    }
    fclose(f);
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

/*
 * Bring g_root up to date with the scenario file.  Caller holds g_lock.
 * strict (used by init): the file must be readable and valid right now.
 * Otherwise a missing/half-written file keeps the last good state.
 * Returns 0 when a scenario is available.
 */
static int reload_locked(int strict)
{
    const char *path = getenv(SIM_ENV);
    struct stat st;
    if (!path || !*path)
        return (!strict && g_root) ? 0 : -1;
    if (stat(path, &st) != 0)
        return (!strict && g_root) ? 0 : -1;
    if (g_root && stamp_matches(&g_stamp, path, &st))
        return 0;

    size_t len = 0;
    char *text = read_whole_file(path, &len);
    if (!text)
        return (!strict && g_root) ? 0 : -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        if (!stamp_matches(&g_bad, path, &st)) {
            long off = (root == NULL && end != NULL) ? (long)(end - text) : 0;
            fprintf(stderr, "fake_nvml: %s: not a valid scenario (JSON object expected; "
                            "error near byte %ld)\n", path, off);
            stamp_from_stat(&g_bad, path, &st);
        }
        cJSON_Delete(root);
        free(text);
        return (!strict && g_root) ? 0 : -1;
    }
    free(text);
    cJSON_Delete(g_root);
    g_root = root;
    stamp_from_stat(&g_stamp, path, &st);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* JSON helpers                                                              */
/* ------------------------------------------------------------------------ */

enum { J_BAD = -1, J_MISSING = 0, J_OK = 1 };

static cJSON *jget(const cJSON *obj, const char *key)
{
    if (!obj || !cJSON_IsObject(obj))
        return NULL;
    cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (it && cJSON_IsNull(it))
        return NULL;
    return it;
}

/* Dotted lookup: "thresholds.shutdown". */
static cJSON *jpath(const cJSON *obj, const char *dotted)
{
    char key[128];
    const cJSON *cur = obj;
    while (cur && *dotted) {
        const char *dot = strchr(dotted, '.');
        size_t n = dot ? (size_t)(dot - dotted) : strlen(dotted);
        if (n >= sizeof(key))
            return NULL;
        memcpy(key, dotted, n);
        key[n] = '\0';
        cur = jget(cur, key);
        dotted += n + (dot ? 1 : 0);
    }
    return (cJSON *)cur;
}

/* Unsigned integer: JSON number, bool, or string ("0x233010DE", "12"). */
static int jnum(const cJSON *it, unsigned long long *out)
{
    if (!it)
        return J_MISSING;
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it) ? 1 : 0;
        return J_OK;
    }
    if (cJSON_IsNumber(it)) {
        double d = it->valuedouble;
        if (d < 0 || d > 18446744073709551615.0 || d != (double)(unsigned long long)d)
            return J_BAD;
        *out = (unsigned long long)d;
        return J_OK;
    }
    if (cJSON_IsString(it) && it->valuestring[0]) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(it->valuestring, &end, 0);
        if (errno || !end || *end || it->valuestring[0] == '-')
            return J_BAD;
        *out = v;
        return J_OK;
    }
    return J_BAD;
}

static int jsigned(const cJSON *it, long long *out)
{
    if (it && cJSON_IsNumber(it)) {
        double d = it->valuedouble;
        if (d != (double)(long long)d)
            return J_BAD;
        *out = (long long)d;
        return J_OK;
    }
    unsigned long long u;
    int s = jnum(it, &u);
    if (s == J_OK) {
        if (u > (unsigned long long)LLONG_MAX)
            return J_BAD;
        *out = (long long)u;
    }
    return s;
}

static int juint(const cJSON *it, unsigned int *out)
{
    unsigned long long v;
    int s = jnum(it, &v);
    if (s != J_OK)
        return s;
    if (v > UINT_MAX)
        return J_BAD;
    *out = (unsigned int)v;
    return J_OK;
}

static int jtrue(const cJSON *it)
{
    unsigned long long v;
    return jnum(it, &v) == J_OK && v != 0;
}

static nvmlReturn_t jstatus_rc(int s)
{
    return s == J_OK ? NVML_SUCCESS : (s == J_MISSING ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNKNOWN);
}

static nvmlReturn_t copy_str(const char *s, char *buf, unsigned int length)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s);
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Forced errors, GPU lookup, locking                                        */
/* ------------------------------------------------------------------------ */

/* errors[fn], or errors[fn without its "_vN" suffix]; 0 means "no override". */
static int forced_lookup(const cJSON *errors, const char *fn, nvmlReturn_t *rc)
{
    long long v;
    cJSON *it;
    if (!errors)
        return 0;
    it = jget(errors, fn);
    if (!it) {
        const char *us = strrchr(fn, '_');
        if (us && us[1] == 'v' && us[2] >= '0' && us[2] <= '9' && (size_t)(us - fn) < 128) {
            char base[128];
            memcpy(base, fn, (size_t)(us - fn));
            base[us - fn] = '\0';
            it = jget(errors, base);
        }
    }
    if (!it || jsigned(it, &v) != J_OK || v == 0)
        return 0;
    *rc = (nvmlReturn_t)v;
    return 1;
}

static nvmlReturn_t forced(const cJSON *gpu, const char *fn)
{
    nvmlReturn_t rc;
    if (gpu && forced_lookup(jget(gpu, "errors"), fn, &rc))
        return rc;
    if (forced_lookup(jget(g_root, "errors"), fn, &rc))
        return rc;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Driver branch profiles                                                    */
/* ------------------------------------------------------------------------ */

/* First branch whose nvml.h declares the function (CUDA 12.0 = R525, 12.2 = R535,
 * 12.4 = R550, 12.6 = R560, 12.8 = R570, 12.9 = R575, 13.0 = R580).  Functions not listed
 * exist on every profile.  nvmlDeviceGetTemperatureV is first declared in the CUDA 12.8
 * header; nvmlDeviceGetCurrentClocksEventReasons in 12.2 (before: ...ClocksThrottleReasons). */
static const struct {
    const char *fn;
    unsigned int since;
} g_since[] = {
    {"nvmlDeviceGetCurrentClocksEventReasons", 535},
    {"nvmlDeviceGetGpuFabricInfoV", 550},
    {"nvmlDeviceGetSramEccErrorStatus", 550},
    {"nvmlDeviceGetTemperatureV", 570},
};

/* One greater than the largest field id each branch defines (NVML_FI_MAX). */
static const struct {
    unsigned int branch, fi_max;
} g_fi_max[] = {{535, 197}, {550, 200}, {560, 230}, {570, 269}, {575, 274}};

/* The scenario's driver branch ("535.183.01" -> 535); 0 means newest (no limits). */
static unsigned int driver_branch(void)
{
    cJSON *v = jget(g_root, "driver_version");
    if (!v || !cJSON_IsString(v))
        return 0;
    char *end = NULL;
    unsigned long b = strtoul(v->valuestring, &end, 10);
    return (end == v->valuestring || b > 100000) ? 0 : (unsigned int)b;
}

static int listed_missing(const char *fn)
{
    cJSON *list = jget(g_root, "missing_functions"), *it;
    if (!list || !cJSON_IsArray(list))
        return 0;
    cJSON_ArrayForEach(it, list) {
        if (cJSON_IsString(it) && strcmp(it->valuestring, fn) == 0)
            return 1;
    }
    return 0;
}

/* Does the scenario's driver have fn?  Lock held. */
static int function_exists(const char *fn)
{
    unsigned int branch = driver_branch();
    if (listed_missing(fn))
        return 0;
    if (branch == 0)
        return 1;
    for (size_t i = 0; i < sizeof(g_since) / sizeof(g_since[0]); i++)
        if (strcmp(g_since[i].fn, fn) == 0)
            return branch >= g_since[i].since;
    return 1;
}

/* Is a field id known to the scenario's driver?  Lock held. */
static int field_known(unsigned int field_id)
{
    unsigned int branch = driver_branch();
    size_t n = sizeof(g_fi_max) / sizeof(g_fi_max[0]);
    if (branch == 0)
        return 1;
    for (size_t i = n; i-- > 0;)
        if (branch >= g_fi_max[i].branch || i == 0)
            return field_id < g_fi_max[i].fi_max;
    return 1;
}

/* Event types the scenario's driver knows.  Lock held. */
static unsigned long long branch_events(void)
{
    unsigned int branch = driver_branch();
    if (branch == 0 || branch >= 570)
        return ~0ULL;
    return branch >= 560 ? EVENTS_R560 : EVENTS_R535;
}

/* Struct version accepted by the branch (fabric info: v3 from R580). */
static int fabric_v3_known(void)
{
    unsigned int branch = driver_branch();
    return branch == 0 || branch >= 580;
}

static unsigned int gpu_count(void)
{
    cJSON *gpus = jget(g_root, "gpus");
    if (!gpus || !cJSON_IsArray(gpus))
        return 0;
    int n = cJSON_GetArraySize(gpus);
    return n > MAX_GPUS ? MAX_GPUS : (unsigned int)n;
}

static cJSON *gpu_at(unsigned int i)
{
    return cJSON_GetArrayItem(jget(g_root, "gpus"), (int)i);
}

static int gpu_lost(const cJSON *gpu)
{
    return jtrue(jget(gpu, "lost"));
}

static nvmlDevice_t handle_for(unsigned int i)
{
    g_devices[i].index = i;
    return &g_devices[i];
}

/* Index of a handle we gave out, or -1. */
static int handle_index(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device, base = (uintptr_t)g_devices;
    if (!device || p < base || p >= base + sizeof(g_devices) ||
        (p - base) % sizeof(g_devices[0]) != 0)
        return -1;
    return (int)((p - base) / sizeof(g_devices[0]));
}

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* Lock, check init, reload, apply top-level forced errors.  On success the lock is held. */
static nvmlReturn_t enter_global(const char *fn)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked(0);
    if (!function_exists(fn))
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    nvmlReturn_t rc = forced(NULL, fn);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    return NVML_SUCCESS;
}

/* A GPU with "hang": true blocks every device call, as a GPU stuck in the driver does,
 * until the scenario clears it.  The lock is not held while blocked. */
static void block_while_hung(int idx)
{
    for (;;) {
        pthread_mutex_lock(&g_lock);
        reload_locked(0);
        int hung = g_root && idx >= 0 && (unsigned int)idx < gpu_count() &&
                   jtrue(jget(gpu_at((unsigned int)idx), "hang"));
        pthread_mutex_unlock(&g_lock);
        if (!hung)
            return;
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* As enter_global, for a device call.  On success the lock is held and *gpu set. */
static nvmlReturn_t enter_device(nvmlDevice_t device, const char *fn, cJSON **gpu)
{
    block_while_hung(handle_index(device));
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked(0);
    if (!function_exists(fn))
        return leave(NVML_ERROR_FUNCTION_NOT_FOUND);
    int idx = handle_index(device);
    if (idx < 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((unsigned int)idx >= gpu_count())
        return leave(NVML_ERROR_GPU_IS_LOST); /* the GPU vanished from the scenario */
    *gpu = gpu_at((unsigned int)idx);
    if (gpu_lost(*gpu))
        return leave(NVML_ERROR_GPU_IS_LOST);
    nvmlReturn_t rc = forced(*gpu, fn);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    return NVML_SUCCESS;
}

/* Generic device getters. */
static nvmlReturn_t dev_u64(nvmlDevice_t device, const char *fn, const char *path,
                            unsigned long long *out)
{
    cJSON *gpu;
    unsigned long long v;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = jnum(jpath(gpu, path), &v);
    if (s == J_OK)
        *out = v;
    return leave(jstatus_rc(s));
}

static nvmlReturn_t dev_uint(nvmlDevice_t device, const char *fn, const char *path,
                             unsigned int *out)
{
    cJSON *gpu;
    unsigned int v;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = juint(jpath(gpu, path), &v);
    if (s == J_OK)
        *out = v;
    return leave(jstatus_rc(s));
}

/* Two values from one call (current/pending modes); both must be present. */
static nvmlReturn_t dev_uint_pair(nvmlDevice_t device, const char *fn, const char *path_a,
                                  const char *path_b, unsigned int *a, unsigned int *b)
{
    cJSON *gpu;
    unsigned int va, vb;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!a || !b)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = juint(jpath(gpu, path_a), &va);
    if (s == J_OK)
        s = juint(jpath(gpu, path_b), &vb);
    if (s == J_OK) {
        *a = va;
        *b = vb;
    }
    return leave(jstatus_rc(s));
}

static nvmlReturn_t dev_str(nvmlDevice_t device, const char *fn, const char *path, char *buf,
                            unsigned int length)
{
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    cJSON *it = jpath(gpu, path);
    if (!it)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!cJSON_IsString(it))
        return leave(NVML_ERROR_UNKNOWN);
    return leave(copy_str(it->valuestring, buf, length));
}

static nvmlReturn_t sys_str(const char *fn, const char *key, char *buf, unsigned int length)
{
    nvmlReturn_t rc = enter_global(fn);
    if (rc != NVML_SUCCESS)
        return rc;
    cJSON *it = jget(g_root, key);
    if (!it)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!cJSON_IsString(it))
        return leave(NVML_ERROR_UNKNOWN);
    return leave(copy_str(it->valuestring, buf, length));
}

/* ------------------------------------------------------------------------ */
/* Init / shutdown / errors                                                  */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t do_init(const char *fn)
{
    long long code;
    pthread_mutex_lock(&g_lock);
    if (reload_locked(1) != 0)
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    if (jsigned(jget(g_root, "init_error"), &code) == J_OK && code != 0)
        return leave((nvmlReturn_t)code);
    nvmlReturn_t rc = forced(NULL, fn);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    g_init_count++;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(__func__);
}

nvmlReturn_t DECLDIR nvmlInit_v2(void)
{
    return do_init(__func__);
}

nvmlReturn_t DECLDIR nvmlInit(void)
{
    return do_init(__func__);
}

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    if (--g_init_count == 0) {
        cJSON_Delete(g_root);
        g_root = NULL;
        g_stamp.valid = 0;
    }
    return leave(NVML_SUCCESS);
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------ */
/* System                                                                    */
/* ------------------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return sys_str(__func__, "driver_version", version, length);
}

/* The library's own version: answered without nvmlInit, as the real library does (nvidia-smi
 * prints it after "Failed to initialize NVML: Driver/library version mismatch"). */
nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    pthread_mutex_lock(&g_lock);
    if (reload_locked(0) != 0)
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    cJSON *it = jget(g_root, "nvml_version");
    if (!it)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!cJSON_IsString(it))
        return leave(NVML_ERROR_UNKNOWN);
    return leave(copy_str(it->valuestring, version, length));
}

static nvmlReturn_t cuda_version(const char *fn, int *out)
{
    long long v;
    nvmlReturn_t rc = enter_global(fn);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = jsigned(jget(g_root, "cuda_driver_version"), &v);
    if (s == J_OK && (v < INT_MIN || v > INT_MAX))
        s = J_BAD;
    if (s == J_OK)
        *out = (int)v;
    return leave(jstatus_rc(s));
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_version(__func__, cudaDriverVersion);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_version(__func__, cudaDriverVersion);
}

/* ------------------------------------------------------------------------ */
/* Enumeration and handles                                                   */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t device_count(const char *fn, unsigned int *count)
{
    nvmlReturn_t rc = enter_global(fn);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = gpu_count();
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    return device_count(__func__, deviceCount);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return device_count(__func__, deviceCount);
}

/* Common tail of the handle lookups: lost and forced errors of the GPU found. */
static nvmlReturn_t hand_out(const char *fn, unsigned int i, nvmlDevice_t *device)
{
    cJSON *gpu = gpu_at(i);
    if (gpu_lost(gpu))
        return NVML_ERROR_GPU_IS_LOST;
    nvmlReturn_t rc = forced(gpu, fn);
    if (rc != NVML_SUCCESS)
        return rc;
    *device = handle_for(i);
    return NVML_SUCCESS;
}

static nvmlReturn_t handle_by_index(const char *fn, unsigned int index, nvmlDevice_t *device)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked(0);
    if (!device || index >= gpu_count())
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(hand_out(fn, index, device));
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(__func__, index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked(0);
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = gpu_count();
    for (unsigned int i = 0; i < n; i++) {
        cJSON *u = jget(gpu_at(i), "uuid");
        if (u && cJSON_IsString(u) && strcmp(u->valuestring, uuid) == 0)
            return leave(hand_out(__func__, i, device));
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" or "BB:DD.F" (domain 0). */
static int parse_bus_id(const char *s, unsigned int *dom, unsigned int *bus, unsigned int *dev,
                        unsigned int *fn)
{
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) == 4)
        return 0;
    *dom = 0;
    if (sscanf(s, "%x:%x.%x%c", bus, dev, fn, &tail) == 3)
        return 0;
    return -1;
}

static const char *gpu_bus_id(const cJSON *gpu)
{
    cJSON *b = jpath(gpu, "pci.bus_id");
    return (b && cJSON_IsString(b)) ? b->valuestring : NULL;
}

static nvmlReturn_t handle_by_bus(const char *fn, const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int d0, b0, v0, f0, d1, b1, v1, f1;
    pthread_mutex_lock(&g_lock);
    if (g_init_count <= 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    reload_locked(0);
    if (!pciBusId || !device || parse_bus_id(pciBusId, &d0, &b0, &v0, &f0) != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = gpu_count();
    for (unsigned int i = 0; i < n; i++) {
        const char *bid = gpu_bus_id(gpu_at(i));
        if (bid && parse_bus_id(bid, &d1, &b1, &v1, &f1) == 0 && d0 == d1 && b0 == b1 &&
            v0 == v1 && f0 == f1)
            return leave(hand_out(fn, i, device));
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus(__func__, pciBusId, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus(__func__, pciBusId, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!index)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)handle_index(device);
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Identity                                                                  */
/* ------------------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return dev_str(device, __func__, "name", name, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return dev_str(device, __func__, "uuid", uuid, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    return dev_str(device, __func__, "serial", serial, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                               unsigned int length)
{
    return dev_str(device, __func__, "vbios", version, length);
}

static nvmlReturn_t pci_info(nvmlDevice_t device, const char *fn, nvmlPciInfo_t *pci)
{
    cJSON *gpu;
    unsigned int dom, bus, dev, func, dev_id = 0, subsys = 0;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    cJSON *p = jget(gpu, "pci");
    if (!p)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    const char *bid = gpu_bus_id(gpu);
    if (!bid || parse_bus_id(bid, &dom, &bus, &dev, &func) != 0)
        return leave(NVML_ERROR_UNKNOWN);
    if (juint(jget(p, "pci_device_id"), &dev_id) == J_BAD ||
        juint(jget(p, "pci_subsystem_id"), &subsys) == J_BAD)
        return leave(NVML_ERROR_UNKNOWN);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             dom & 0xFFFF, bus & 0xFF, dev & 0xFF);
    snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT, dom, bus & 0xFF,
             dev & 0xFF);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = dev_id;
    pci->pciSubSystemId = subsys;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, __func__, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, __func__, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, __func__, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    return dev_uint(device, __func__, "architecture", arch);
}

nvmlReturn_t DECLDIR nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    unsigned int v = 0;
    nvmlReturn_t rc = dev_uint(device, __func__, "brand", type ? &v : NULL);
    if (rc == NVML_SUCCESS)
        *type = (nvmlBrandType_t)v;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Modes                                                                     */
/* ------------------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    unsigned int v = 0;
    nvmlReturn_t rc = dev_uint(device, __func__, "persistence_mode", mode ? &v : NULL);
    if (rc == NVML_SUCCESS)
        *mode = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return rc;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                          unsigned int *pendingMode)
{
    return dev_uint_pair(device, __func__, "mig.current", "mig.pending", currentMode, pendingMode);
}

nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                          nvmlEnableState_t *pending)
{
    unsigned int c = 0, p = 0;
    nvmlReturn_t rc = dev_uint_pair(device, __func__, "ecc_mode.current", "ecc_mode.pending",
                                    current ? &c : NULL, pending ? &p : NULL);
    if (rc == NVML_SUCCESS) {
        *current = c ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
        *pending = p ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    }
    return rc;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    unsigned int v = 0;
    nvmlReturn_t rc = dev_uint(device, __func__, "performance_state", pState ? &v : NULL);
    if (rc == NVML_SUCCESS)
        *pState = (nvmlPstates_t)v;
    return rc;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    cJSON *gpu;
    unsigned long long total, freeb, used;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!memory)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = jnum(jpath(gpu, "memory.total"), &total);
    if (s == J_OK)
        s = jnum(jpath(gpu, "memory.free"), &freeb);
    if (s == J_OK)
        s = jnum(jpath(gpu, "memory.used"), &used);
    if (s == J_OK) {
        memory->total = total;
        memory->free = freeb;
        memory->used = used;
    }
    return leave(jstatus_rc(s));
}

/* ------------------------------------------------------------------------ */
/* ECC, retired pages, remapped rows                                         */
/* ------------------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                 nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType,
                                                 unsigned long long *eccCounts)
{
    static const char *paths[2][2] = {
        {"ecc.corrected.volatile", "ecc.corrected.aggregate"},
        {"ecc.uncorrected.volatile", "ecc.uncorrected.aggregate"},
    };
    if ((unsigned int)errorType > 1 || (unsigned int)counterType > 1) {
        /* still report uninitialized / lost first, like the real library */
        cJSON *gpu;
        nvmlReturn_t rc = enter_device(device, __func__, &gpu);
        return rc != NVML_SUCCESS ? rc : leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    return dev_u64(device, __func__, paths[errorType][counterType], eccCounts);
}

/* Entry of a retired-page list: an address, or {"address": A, "timestamp": T}. */
static int page_entry(const cJSON *it, unsigned long long *addr, unsigned long long *ts)
{
    *ts = 0;
    if (cJSON_IsObject(it)) {
        int s = jnum(jget(it, "address"), addr);
        if (s != J_OK)
            return J_BAD;
        if (jget(it, "timestamp") && jnum(jget(it, "timestamp"), ts) != J_OK)
            return J_BAD;
        return J_OK;
    }
    return jnum(it, addr) == J_OK ? J_OK : J_BAD;
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, const char *fn,
                                  nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps)
{
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pageCount || (unsigned int)cause > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    cJSON *list = jpath(gpu, cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                                 ? "retired_pages.dbe" : "retired_pages.sbe");
    if (!list)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int n;
    int synthetic = 0;
    if (cJSON_IsArray(list)) {
        n = (unsigned int)cJSON_GetArraySize(list);
    } else if (juint(list, &n) == J_OK) {
        synthetic = 1; /* a bare count: make up page addresses */
    } else {
        return leave(NVML_ERROR_UNKNOWN);
    }
    if (*pageCount < n || (!addresses && n > 0)) {
        *pageCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        unsigned long long a, t;
        if (synthetic) {
            a = 0x100000ULL + (unsigned long long)i * 0x1000ULL +
                (cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? 0x800000ULL : 0);
            t = 0;
        } else if (page_entry(cJSON_GetArrayItem(list, (int)i), &a, &t) != J_OK) {
            return leave(NVML_ERROR_UNKNOWN);
        }
        addresses[i] = a;
        if (timestamps)
            timestamps[i] = t;
    }
    *pageCount = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages(nvmlDevice_t device,
                                               nvmlPageRetirementCause_t cause,
                                               unsigned int *pageCount,
                                               unsigned long long *addresses)
{
    return retired_pages(device, __func__, cause, pageCount, addresses, NULL);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device,
                                                  nvmlPageRetirementCause_t cause,
                                                  unsigned int *pageCount,
                                                  unsigned long long *addresses,
                                                  unsigned long long *timestamps)
{
    return retired_pages(device, __func__, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                            nvmlEnableState_t *isPending)
{
    unsigned int v = 0;
    nvmlReturn_t rc = dev_uint(device, __func__, "retired_pages.pending", isPending ? &v : NULL);
    if (rc == NVML_SUCCESS)
        *isPending = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return rc;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                               unsigned int *uncRows, unsigned int *isPending,
                                               unsigned int *failureOccurred)
{
    static const char *keys[4] = {"correctable", "uncorrectable", "pending", "failure"};
    unsigned int *outs[4] = {corrRows, uncRows, isPending, failureOccurred};
    unsigned int vals[4] = {0, 0, 0, 0};
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    cJSON *rr = jget(gpu, "remapped_rows");
    if (!rr)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (int i = 0; i < 4; i++) {
        int s = juint(jget(rr, keys[i]), &vals[i]); /* absent sub-key reads as 0 */
        if (s == J_BAD)
            return leave(NVML_ERROR_UNKNOWN);
    }
    for (int i = 0; i < 4; i++)
        *outs[i] = (i >= 2) ? (vals[i] != 0) : vals[i];
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Thermal, power, clocks, PCIe                                              */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t gpu_temperature(nvmlDevice_t device, const char *fn,
                                    nvmlTemperatureSensors_t sensor, int *out)
{
    cJSON *gpu;
    long long v;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!out || sensor != NVML_TEMPERATURE_GPU)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = jsigned(jget(gpu, "temperature"), &v);
    if (s == J_OK && (v < INT_MIN || v > INT_MAX))
        s = J_BAD;
    if (s == J_OK)
        *out = (int)v;
    return leave(jstatus_rc(s));
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device,
                                              nvmlTemperatureSensors_t sensorType,
                                              unsigned int *temp)
{
    int t = 0;
    nvmlReturn_t rc = gpu_temperature(device, __func__, sensorType, temp ? &t : NULL);
    if (rc == NVML_SUCCESS)
        *temp = t < 0 ? 0U : (unsigned int)t;
    return rc;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    if (temperature && temperature->version != nvmlTemperature_v1) {
        cJSON *gpu;
        nvmlReturn_t rc = enter_device(device, __func__, &gpu);
        return rc != NVML_SUCCESS ? rc : leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    return gpu_temperature(device, __func__, temperature ? temperature->sensorType
                                                         : NVML_TEMPERATURE_GPU,
                           temperature ? &temperature->temperature : NULL);
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                       nvmlTemperatureThresholds_t thresholdType,
                                                       unsigned int *temp)
{
    const char *path;
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: path = "thresholds.shutdown"; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: path = "thresholds.slowdown"; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: path = "thresholds.mem_max"; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: path = "thresholds.gpu_max"; break;
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN: path = "thresholds.acoustic_min"; break;
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR: path = "thresholds.acoustic_curr"; break;
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX: path = "thresholds.acoustic_max"; break;
    case NVML_TEMPERATURE_THRESHOLD_GPS_CURR: path = "thresholds.gps_curr"; break;
    default: {
        cJSON *gpu;
        nvmlReturn_t rc = enter_device(device, __func__, &gpu);
        return rc != NVML_SUCCESS ? rc : leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    }
    return dev_uint(device, __func__, path, temp);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return dev_uint(device, __func__, "power_usage_mw", power);
}

nvmlReturn_t DECLDIR nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return dev_uint(device, __func__, "enforced_power_limit_mw", limit);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return dev_uint(device, __func__, "power_management_limit_mw", limit);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                            unsigned long long *clocksEventReasons)
{
    return dev_u64(device, __func__, "clocks_event_reasons", clocksEventReasons);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                               unsigned long long *clocksThrottleReasons)
{
    return dev_u64(device, __func__, "clocks_event_reasons", clocksThrottleReasons);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device,
                                                         unsigned int *currLinkGen)
{
    return dev_uint(device, __func__, "pcie.gen_current", currLinkGen);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device,
                                                        unsigned int *maxLinkGen)
{
    return dev_uint(device, __func__, "pcie.gen_max", maxLinkGen);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device,
                                                    unsigned int *currLinkWidth)
{
    return dev_uint(device, __func__, "pcie.width_current", currLinkWidth);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    return dev_uint(device, __func__, "pcie.width_max", maxLinkWidth);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    return dev_uint(device, __func__, "pcie_replay_counter", value);
}

static const char *clock_name(nvmlClockType_t type)
{
    switch (type) {
    case NVML_CLOCK_GRAPHICS: return "graphics";
    case NVML_CLOCK_SM: return "sm";
    case NVML_CLOCK_MEM: return "mem";
    case NVML_CLOCK_VIDEO: return "video";
    default: return NULL;
    }
}

/* "clocks": {"sm": MHz, ...} (current) and "max_clocks": {...}. */
static nvmlReturn_t clock_info(nvmlDevice_t device, const char *fn, const char *section,
                               nvmlClockType_t type, unsigned int *clock)
{
    char path[64];
    const char *name = clock_name(type);
    if (!name) {
        cJSON *gpu;
        nvmlReturn_t rc = enter_device(device, fn, &gpu);
        return rc != NVML_SUCCESS ? rc : leave(NVML_ERROR_INVALID_ARGUMENT);
    }
    snprintf(path, sizeof(path), "%s.%s", section, name);
    return dev_uint(device, fn, path, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                            unsigned int *clock)
{
    return clock_info(device, __func__, "clocks", type, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                               unsigned int *clock)
{
    return clock_info(device, __func__, "max_clocks", type, clock);
}

/* "violations": {"power": ns, "thermal": ns, ...}: time held below application clocks. */
nvmlReturn_t DECLDIR nvmlDeviceGetViolationStatus(nvmlDevice_t device,
                                                  nvmlPerfPolicyType_t perfPolicyType,
                                                  nvmlViolationTime_t *violTime)
{
    static const char *names[] = {"power", "thermal", "sync_boost", "board_limit",
                                  "low_utilization", "reliability"};
    cJSON *gpu;
    unsigned long long ns;
    struct timespec now;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!violTime || (unsigned int)perfPolicyType >= sizeof(names) / sizeof(names[0]))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = jnum(jget(jget(gpu, "violations"), names[perfPolicyType]), &ns);
    if (s == J_OK) {
        clock_gettime(CLOCK_REALTIME, &now);
        violTime->referenceTime = (unsigned long long)now.tv_sec * 1000000ULL +
                                  (unsigned long long)now.tv_nsec / 1000ULL;
        violTime->violationTime = ns;
    }
    return leave(jstatus_rc(s));
}

/* "sram_ecc": {"threshold_exceeded": 0|1, "volatile_cor": n, ...} (nvmlEccSramErrorStatus_v1). */
nvmlReturn_t DECLDIR nvmlDeviceGetSramEccErrorStatus(nvmlDevice_t device,
                                                     nvmlEccSramErrorStatus_t *status)
{
    static const char *keys[] = {"aggregate_unc_parity", "aggregate_unc_sec_ded", "aggregate_cor",
                                 "volatile_unc_parity", "volatile_unc_sec_ded", "volatile_cor",
                                 "aggregate_unc_bucket_l2", "aggregate_unc_bucket_sm",
                                 "aggregate_unc_bucket_pcie", "aggregate_unc_bucket_mcu",
                                 "aggregate_unc_bucket_other"};
    cJSON *gpu;
    unsigned long long vals[sizeof(keys) / sizeof(keys[0])] = {0};
    unsigned int exceeded = 0;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!status)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (status->version != nvmlEccSramErrorStatus_v1)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    cJSON *sram = jget(gpu, "sram_ecc");
    if (!sram)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (jnum(jget(sram, keys[i]), &vals[i]) == J_BAD)
            return leave(NVML_ERROR_UNKNOWN);
    if (juint(jget(sram, "threshold_exceeded"), &exceeded) == J_BAD)
        return leave(NVML_ERROR_UNKNOWN);
    status->aggregateUncParity = vals[0];
    status->aggregateUncSecDed = vals[1];
    status->aggregateCor = vals[2];
    status->volatileUncParity = vals[3];
    status->volatileUncSecDed = vals[4];
    status->volatileCor = vals[5];
    status->aggregateUncBucketL2 = vals[6];
    status->aggregateUncBucketSm = vals[7];
    status->aggregateUncBucketPcie = vals[8];
    status->aggregateUncBucketMcu = vals[9];
    status->aggregateUncBucketOther = vals[10];
    status->bThresholdExceeded = exceeded ? 1 : 0;
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Field values, NVLink, fabric                                              */
/* ------------------------------------------------------------------------ */

/* The scenario key behind a scalar field id, or NULL. */
static const char *field_key(unsigned int field_id)
{
    switch (field_id) {
    case FIELD_MEMORY_TEMP: return "memory_temperature";
    case FIELD_PCIE_REPLAY: return "pcie_replay_counter";
    case FIELD_RECOVERY_ACTION:
    case FIELD_RESET_STATUS:
    case FIELD_DRAIN_RESET_STATUS: return "recovery_action";
    default: return NULL;
    }
}

/* One scalar field (lock held).  226/227 are derived from the recovery action, as the
 * driver does: reset needed for GPU_RESET (1) or DRAIN_AND_RESET (4); drain-and-reset for 4. */
static void scalar_field(const cJSON *gpu, nvmlFieldValue_t *v)
{
    const char *key = field_key(v->fieldId);
    unsigned long long x;
    int s = key ? jnum(jget(gpu, key), &x) : J_MISSING;
    if (s != J_OK) {
        v->nvmlReturn = jstatus_rc(s);
        return;
    }
    if (v->fieldId == FIELD_RESET_STATUS)
        x = (x == 1 || x == 4);
    else if (v->fieldId == FIELD_DRAIN_RESET_STATUS)
        x = (x == 4);
    v->valueType = v->fieldId == FIELD_PCIE_REPLAY ? NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                                                    : NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.ullVal = x; /* uiVal shares the low bytes (little-endian) */
    v->nvmlReturn = NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                              nvmlFieldValue_t *values)
{
    cJSON *gpu;
    struct timespec now;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (valuesCount < 0 || (!values && valuesCount > 0))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    clock_gettime(CLOCK_REALTIME, &now);
    long long now_us = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
    cJSON *links = jget(gpu, "nvlink");
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        char key[32];
        nvmlReturn_t frc;
        v->timestamp = now_us;
        v->latencyUsec = 0;
        v->value.ullVal = 0;
        snprintf(key, sizeof(key), "field:%u", v->fieldId);
        frc = forced(gpu, key);
        if (frc != NVML_SUCCESS) {
            v->nvmlReturn = frc;
        } else if (!field_known(v->fieldId)) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; /* past this branch's NVML_FI_MAX */
        } else if (v->fieldId != NVML_FI_DEV_NVLINK_LINK_COUNT) {
            scalar_field(gpu, v);
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            if (!links) {
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            } else if (!cJSON_IsArray(links)) {
                v->nvmlReturn = NVML_ERROR_UNKNOWN;
            } else {
                v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                v->value.ullVal = (unsigned long long)cJSON_GetArraySize(links); /* uiVal too */
                v->nvmlReturn = NVML_SUCCESS;
            }
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

/* Enter a device call about one NVLink; on success the lock is held and *link set. */
static nvmlReturn_t enter_link(nvmlDevice_t device, const char *fn, unsigned int link,
                               cJSON **entry)
{
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    cJSON *links = jget(gpu, "nvlink");
    if (!links)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!cJSON_IsArray(links))
        return leave(NVML_ERROR_UNKNOWN);
    if (link >= (unsigned int)cJSON_GetArraySize(links))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *entry = cJSON_GetArrayItem(links, (int)link);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                              nvmlEnableState_t *isActive)
{
    cJSON *entry;
    unsigned int v;
    nvmlReturn_t rc = enter_link(device, __func__, link, &entry);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!isActive)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    int s = juint(jget(entry, "state"), &v);
    if (s == J_OK)
        *isActive = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(jstatus_rc(s));
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                unsigned int *version)
{
    cJSON *entry;
    nvmlReturn_t rc = enter_link(device, __func__, link, &entry);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!version)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(jstatus_rc(juint(jget(entry, "version"), version)));
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                     nvmlNvLinkErrorCounter_t counter,
                                                     unsigned long long *counterValue)
{
    static const char *names[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
    cJSON *entry;
    nvmlReturn_t rc = enter_link(device, __func__, link, &entry);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!counterValue || (unsigned int)counter >= sizeof(names) / sizeof(names[0]))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(jstatus_rc(jnum(jget(jget(entry, "errors"), names[counter]), counterValue)));
}

/* cluster_uuid "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (dashes optional) -> 16 bytes. */
static int parse_uuid16(const char *s, unsigned char out[NVML_GPU_FABRIC_UUID_LEN])
{
    int n = 0, hi = -1;
    for (; *s; s++) {
        int v;
        if (*s == '-')
            continue;
        if (*s >= '0' && *s <= '9') v = *s - '0';
        else if (*s >= 'a' && *s <= 'f') v = *s - 'a' + 10;
        else if (*s >= 'A' && *s <= 'F') v = *s - 'A' + 10;
        else return -1;
        if (hi < 0) {
            hi = v;
        } else {
            if (n >= NVML_GPU_FABRIC_UUID_LEN)
                return -1;
            out[n++] = (unsigned char)(hi << 4 | v);
            hi = -1;
        }
    }
    return (n == NVML_GPU_FABRIC_UUID_LEN && hi < 0) ? 0 : -1;
}

struct fabric_vals {
    unsigned char uuid[NVML_GPU_FABRIC_UUID_LEN];
    unsigned int state, status, clique, mask, summary;
};

/* Reads "fabric"; returns NVML_SUCCESS or the error for the call. Lock held. */
static nvmlReturn_t read_fabric(const cJSON *gpu, struct fabric_vals *f)
{
    cJSON *fab = jget(gpu, "fabric");
    memset(f, 0, sizeof(*f));
    if (!fab)
        return NVML_ERROR_NOT_SUPPORTED;
    int s = juint(jget(fab, "state"), &f->state);
    if (s != J_OK)
        return jstatus_rc(s);
    if (juint(jget(fab, "status"), &f->status) == J_BAD ||
        juint(jget(fab, "clique_id"), &f->clique) == J_BAD ||
        juint(jget(fab, "health_mask"), &f->mask) == J_BAD)
        return NVML_ERROR_UNKNOWN;
    if (juint(jget(fab, "health_summary"), &f->summary) == J_BAD)
        return NVML_ERROR_UNKNOWN;
    cJSON *u = jget(fab, "cluster_uuid");
    if (u && (!cJSON_IsString(u) || parse_uuid16(u->valuestring, f->uuid) != 0))
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

/*
 * Accepts nvmlGpuFabricInfo_v2 (R550+) and _v3 (R580+, the driver branch decides; pynvml's
 * c_nvmlGpuFabricInfoV_t is v2).  Older struct versions: ARGUMENT_VERSION_MISMATCH.
 */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device,
                                                 nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    cJSON *gpu;
    struct fabric_vals f;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!gpuFabricInfo)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int version = gpuFabricInfo->version;
#ifdef nvmlGpuFabricInfo_v3
    int v3 = (version == nvmlGpuFabricInfo_v3) && fabric_v3_known();
#else
    int v3 = 0; /* an older nvml.h (CUDA 12.x): only the v2 struct exists */
#endif
    if (!v3 && version != nvmlGpuFabricInfo_v2)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    rc = read_fabric(gpu, &f);
    if (rc != NVML_SUCCESS)
        return leave(rc);
#ifdef nvmlGpuFabricInfo_v3
    if (v3) { /* no "health_summary" in the scenario: NOT_SUPPORTED (0) */
        memset(gpuFabricInfo, 0, sizeof(nvmlGpuFabricInfo_v3_t));
        ((nvmlGpuFabricInfo_v3_t *)gpuFabricInfo)->healthSummary = (unsigned char)f.summary;
    }
#endif
    if (!v3)
        memset(gpuFabricInfo, 0, sizeof(nvmlGpuFabricInfo_v2_t));
    /* v2 is a prefix of v3, so these fields are at the same offsets in both. */
    gpuFabricInfo->version = version;
    memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof(f.uuid));
    gpuFabricInfo->status = (nvmlReturn_t)f.status;
    gpuFabricInfo->cliqueId = f.clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
    gpuFabricInfo->healthMask = f.mask;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device,
                                                nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    cJSON *gpu;
    struct fabric_vals f;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!gpuFabricInfo)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    rc = read_fabric(gpu, &f);
    if (rc != NVML_SUCCESS)
        return leave(rc);
    memset(gpuFabricInfo, 0, sizeof(*gpuFabricInfo));
    memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof(f.uuid));
    gpuFabricInfo->status = (nvmlReturn_t)f.status;
    gpuFabricInfo->cliqueId = f.clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

static long long monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000L;
}

/* Clock-change events per second for one GPU (see the header comment). */
static double clock_hz(const cJSON *gpu)
{
    unsigned long long v;
    cJSON *rates = jget(g_root, "clock_event_hz");
    double idle = CLOCK_IDLE_HZ, load = CLOCK_LOAD_HZ;
    if (jnum(jget(gpu, "clock_event_hz"), &v) == J_OK)
        return (double)v;
    if (jnum(jget(rates, "idle"), &v) == J_OK)
        idle = (double)v;
    if (jnum(jget(rates, "load"), &v) == J_OK)
        load = (double)v;
    return jtrue(jget(gpu, "load")) ? load : idle;
}

/* A due clock event for a registered GPU (lock held); 1 when *data was filled.  Sets
 * set->next_clock_ms to the earliest next one, so a waiter naps no longer than that. */
static int due_clock_event(struct nvmlEventSet_st *set, unsigned int n, nvmlEventData_t *data)
{
    double now = (double)monotonic_ms();
    set->next_clock_ms = 0;
    for (unsigned int i = 0; i < n && i < MAX_GPUS; i++) {
        if (!(set->mask[i] & nvmlEventTypeClock))
            continue;
        double hz = clock_hz(gpu_at(i));
        if (hz <= 0)
            continue;
        double period = 1000.0 / hz, *due = &set->clock_due_ms[i];
        if (*due == 0 || *due < now - 1000.0) /* first look, or nobody waited for a while */
            *due = now + (*due == 0 ? period : 0);
        if (now >= *due) {
            *due += period;
            data->device = handle_for(i);
            data->eventType = nvmlEventTypeClock;
            data->eventData = 0;
            data->gpuInstanceId = 0xFFFFFFFFU;
            data->computeInstanceId = 0xFFFFFFFFU;
            return 1;
        }
        if (set->next_clock_ms == 0 || *due < set->next_clock_ms)
            set->next_clock_ms = *due;
    }
    return 0;
}

static unsigned long long supported_events(const cJSON *gpu, int *bad)
{
    unsigned long long v;
    int s = jnum(jget(gpu, "supported_event_types"), &v);
    *bad = (s == J_BAD);
    return (s == J_OK ? v : DEFAULT_EVENT_TYPES) & branch_events();
}

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = enter_global(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct nvmlEventSet_st *es = calloc(1, sizeof(*es));
    if (!es)
        return leave(NVML_ERROR_MEMORY);
    es->magic = EVENT_SET_MAGIC;
    *set = es;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = enter_global(__func__);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set || set->magic != EVENT_SET_MAGIC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    set->magic = 0;
    free(set->delivered);
    free(set);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                      unsigned long long *eventTypes)
{
    cJSON *gpu;
    int bad;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!eventTypes)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long v = supported_events(gpu, &bad);
    if (bad)
        return leave(NVML_ERROR_UNKNOWN);
    *eventTypes = v;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                              nvmlEventSet_t set)
{
    cJSON *gpu;
    int bad;
    nvmlReturn_t rc = enter_device(device, __func__, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set || set->magic != EVENT_SET_MAGIC)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long supported = supported_events(gpu, &bad);
    if (bad)
        return leave(NVML_ERROR_UNKNOWN);
    if (eventTypes & ~supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    set->mask[handle_index(device)] |= eventTypes;
    return leave(NVML_SUCCESS);
}

static int was_delivered(const struct nvmlEventSet_st *set, long long id)
{
    for (size_t i = 0; i < set->n_delivered; i++)
        if (set->delivered[i] == id)
            return 1;
    return 0;
}

static int mark_delivered(struct nvmlEventSet_st *set, long long id)
{
    if (set->n_delivered == set->cap_delivered) {
        size_t ncap = set->cap_delivered ? set->cap_delivered * 2 : 16;
        long long *n = realloc(set->delivered, ncap * sizeof(*n));
        if (!n)
            return -1;
        set->delivered = n;
        set->cap_delivered = ncap;
    }
    set->delivered[set->n_delivered++] = id;
    return 0;
}

/*
 * One look at the scenario for set (lock held).  Returns NVML_SUCCESS with *data filled,
 * NVML_ERROR_TIMEOUT when nothing is pending yet, or another error to return at once.
 * Pending events are delivered before a lost registered GPU is reported.
 */
static nvmlReturn_t poll_events(struct nvmlEventSet_st *set, const char *fn, nvmlEventData_t *data)
{
    nvmlReturn_t rc = forced(NULL, fn);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int n = gpu_count();
    cJSON *events = jget(g_root, "events");
    if (events && cJSON_IsArray(events)) {
        int pos = 0;
        cJSON *ev;
        cJSON_ArrayForEach(ev, events) {
            unsigned int gi;
            unsigned long long type, edata = 0;
            long long id;
            unsigned int gi_id = 0xFFFFFFFFU, ci_id = 0xFFFFFFFFU;
            pos++;
            if (juint(jget(ev, "gpu"), &gi) != J_OK || gi >= n || gi >= MAX_GPUS)
                continue;
            if (jnum(jget(ev, "type"), &type) != J_OK || !(type & set->mask[gi]))
                continue;
            if (jsigned(jget(ev, "id"), &id) != J_OK)
                id = -(long long)pos; /* implicit id: position in the list */
            if (was_delivered(set, id))
                continue;
            if (jget(ev, "data") && jnum(jget(ev, "data"), &edata) != J_OK)
                continue;
            if (jget(ev, "gpu_instance_id"))
                juint(jget(ev, "gpu_instance_id"), &gi_id);
            if (jget(ev, "compute_instance_id"))
                juint(jget(ev, "compute_instance_id"), &ci_id);
            if (mark_delivered(set, id) != 0)
                return NVML_ERROR_MEMORY;
            data->device = handle_for(gi);
            data->eventType = type;
            data->eventData = edata;
            data->gpuInstanceId = gi_id;
            data->computeInstanceId = ci_id;
            return NVML_SUCCESS;
        }
    }
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        if (!set->mask[i])
            continue;
        if (i >= n || gpu_lost(gpu_at(i)))
            return NVML_ERROR_GPU_IS_LOST;
        rc = forced(gpu_at(i), fn);
        if (rc != NVML_SUCCESS)
            return rc;
    }
    return due_clock_event(set, n, data) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
}

static nvmlReturn_t event_wait(const char *fn, nvmlEventSet_t set, nvmlEventData_t *data,
                               unsigned int timeoutms)
{
    long long deadline = monotonic_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_init_count <= 0)
            return leave(NVML_ERROR_UNINITIALIZED);
        if (!set || set->magic != EVENT_SET_MAGIC || !data)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        reload_locked(0);
        nvmlReturn_t rc = poll_events(set, fn, data);
        pthread_mutex_unlock(&g_lock);
        if (rc != NVML_ERROR_TIMEOUT)
            return rc;
        long long left = deadline - monotonic_ms();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        long long nap = left < EVENT_POLL_MS ? left : EVENT_POLL_MS;
        if (set->next_clock_ms > 0) { /* read without the lock: only this waiter writes it */
            long long until = (long long)set->next_clock_ms - monotonic_ms() + 1;
            if (until < nap)
                nap = until < 1 ? 1 : until;
        }
        struct timespec ts = {nap / 1000, (nap % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                         unsigned int timeoutms)
{
    return event_wait(__func__, set, data, timeoutms);
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                      unsigned int timeoutms)
{
    return event_wait(__func__, set, data, timeoutms);
}

/* ------------------------------------------------------------------ running processes */

/* "processes": [{"pid": N, "used_memory": B, "type": "compute"|"graphics"}] (type defaults
 * to compute). An absent list reads as none, as on an idle GPU. Same contract as the
 * driver's: a too small buffer (or none) gets NVML_ERROR_INSUFFICIENT_SIZE and the count. */
static int process_kind_matches(const cJSON *proc, const char *kind)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(proc, "type");
    const char *have = cJSON_IsString(type) ? type->valuestring : "compute";
    return strcmp(have, kind) == 0;
}

static nvmlReturn_t running_processes(nvmlDevice_t device, const char *fn, const char *kind,
                                      unsigned int *infoCount, nvmlProcessInfo_t *infos)
{
    cJSON *gpu;
    nvmlReturn_t rc = enter_device(device, fn, &gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!infoCount)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    cJSON *list = jpath(gpu, "processes");
    if (list && !cJSON_IsArray(list))
        return leave(NVML_ERROR_UNKNOWN);
    unsigned int n = 0;
    const cJSON *proc;
    cJSON_ArrayForEach(proc, list) {
        if (process_kind_matches(proc, kind))
            n++;
    }
    if (n > 0 && (*infoCount < n || !infos)) {
        *infoCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int i = 0;
    cJSON_ArrayForEach(proc, list) {
        unsigned int pid;
        unsigned long long used = 0;
        if (!process_kind_matches(proc, kind))
            continue;
        if (juint(cJSON_GetObjectItemCaseSensitive(proc, "pid"), &pid) != J_OK)
            return leave(NVML_ERROR_UNKNOWN);
        if (cJSON_GetObjectItemCaseSensitive(proc, "used_memory") &&
            jnum(cJSON_GetObjectItemCaseSensitive(proc, "used_memory"), &used) != J_OK)
            return leave(NVML_ERROR_UNKNOWN);
        infos[i].pid = pid;
        infos[i].usedGpuMemory = used;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
        i++;
    }
    *infoCount = n;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    return running_processes(device, __func__, "compute", infoCount, infos);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return running_processes(device, __func__, "graphics", infoCount, infos);
}
