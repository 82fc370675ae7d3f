/* randomx_standin.c - a string-free stand-in for a RandomX CPU miner, for detection tests.
 *
 *     randomx_standin [SETTINGS_FILE]      (no argument: the settings come on stdin)
 *
 * The settings are "key value" lines (all optional):
 *   peer_ip 127.0.0.1   peer_port 443   tls 1     pool address (an IP literal: no DNS, no SNI)
 *   threads 0           workers (0: one per online CPU)
 *   nice 19             nice value of the workers (a throttled miner)
 *   memory 256          huge-page buffer in MiB (256: RandomX's cache)
 *   dataset 0           1: also a 2080 MiB huge-page dataset built from that cache, which the
 *                       workers read instead (RandomX's fast mode: ~2.3 GiB in all)
 *   rounding 1          switch the SSE rounding mode in the hot loop (RandomX's CFROUND)
 *   submit_s 20         mean seconds between small submits ("shares")
 *   unlink 1            delete SETTINGS_FILE once read (a miner deleting its config)
 *
 * What it does, like RandomX miners do: maps the buffer with MAP_HUGETLB (when no huge pages
 * are reserved it says so on stderr and falls back to ordinary pages with MADV_HUGEPAGE);
 * fills it; one worker per core reads 64-byte lines at data-dependent addresses of it and
 * mixes them with integer multiplies and double-precision arithmetic, changing the MXCSR
 * rounding mode (ldmxcsr) every 256 steps as RandomX programs do; the main thread holds one
 * TCP (or TLS, no SNI, no verification) session to the pool, answers nothing but sends a
 * ~100-byte record at random intervals and reads the jobs the pool pushes.  Run with the
 * settings on stdin its command line is its path alone; a settings file named in argv is
 * blanked from /proc/PID/cmdline after start.  It prints "ready" on stdout once
 * connected and runs until killed.  Test workload only: no miner strings anywhere.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xmmintrin.h>

#define MIB (1024UL * 1024UL)
#define LINE 64

static struct {
    char peer_ip[64];
    int peer_port, tls, threads, nice_value, rounding, unlink_file, dataset;
    unsigned long memory_mib;
    double submit_s;
} cfg = {"127.0.0.1", 443, 1, 0, 0, 1, 1, 0, 256, 20.0};

#define DATASET_MIB 2080UL

static uint8_t *buffer;
static size_t buffer_len;
static volatile uint64_t sink;

static void read_settings(const char *path)
{
    FILE *f = path ? fopen(path, "r") : stdin;
    char key[32], value[64];
    if (!f) {
        perror("settings");
        exit(2);
    }
    while (fscanf(f, "%31s %63s", key, value) == 2) {
        if (!strcmp(key, "peer_ip"))
            snprintf(cfg.peer_ip, sizeof(cfg.peer_ip), "%s", value);
        else if (!strcmp(key, "peer_port"))
            cfg.peer_port = atoi(value);
        else if (!strcmp(key, "tls"))
            cfg.tls = atoi(value);
        else if (!strcmp(key, "threads"))
            cfg.threads = atoi(value);
        else if (!strcmp(key, "nice"))
            cfg.nice_value = atoi(value);
        else if (!strcmp(key, "memory"))
            cfg.memory_mib = strtoul(value, NULL, 10);
        else if (!strcmp(key, "rounding"))
            cfg.rounding = atoi(value);
        else if (!strcmp(key, "submit_s"))
            cfg.submit_s = atof(value);
        else if (!strcmp(key, "unlink"))
            cfg.unlink_file = atoi(value);
        else if (!strcmp(key, "dataset"))
            cfg.dataset = atoi(value);
    }
    if (path)
        fclose(f);
    if (path && cfg.unlink_file)
        unlink(path);
}

static uint8_t *map_huge(size_t len)
{
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "huge pages: %s (none reserved?): using ordinary pages\n",
                strerror(errno));
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
        madvise(p, len, MADV_HUGEPAGE);
    }
    return p;
}

static void map_buffer(void)
{
    size_t cache_len = cfg.memory_mib * MIB;
    uint8_t *cache = map_huge(cache_len);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < cache_len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(cache + i, &x, 8);
    }
    buffer = cache, buffer_len = cache_len;
    if (!cfg.dataset)
        return;
    /* the dataset: every 64-byte item mixed from cache lines at data-dependent places */
    buffer_len = DATASET_MIB * MIB;
    buffer = map_huge(buffer_len);
    for (size_t i = 0; i < buffer_len; i += LINE) {
        const uint64_t *line = (const uint64_t *)(cache + (x % (cache_len / LINE)) * LINE);
        for (int k = 0; k < 8; k++) {
            x = x * 0x5851f42d4c957f2dULL + line[k];
            memcpy(buffer + i + 8 * k, &x, 8);
        }
    }
}

static void *worker(void *arg)
{
    uint64_t r[8], x = (uintptr_t)arg * 0x2545f4914f6cdd1dULL + 1;
    double f[4] = {1.1, 2.2, 3.3, 4.4};
    unsigned int csr = _mm_getcsr();
    for (int i = 0; i < 8; i++)
        r[i] = x + i;
    for (uint64_t step = 0;; step++) {
        /* a data-dependent 64-byte line of the buffer, like a dataset read */
        size_t at = (r[step & 7] % (buffer_len / LINE)) * LINE;
        const uint64_t *line = (const uint64_t *)(buffer + at);
        for (int i = 0; i < 8; i++) {
            r[i] ^= line[i];
            r[i] = r[i] * 0xff51afd7ed558ccdULL + (r[(i + 1) & 7] >> 17);
        }
        f[step & 3] = f[step & 3] * 1.0000001 + (double)(r[0] & 0xffff) / (f[(step + 1) & 3] + 1.0);
        if (f[step & 3] > 1e12 || f[step & 3] < -1e12)
            f[step & 3] = 1.5;
        if (cfg.rounding && (step & 255) == 0)
            _mm_setcsr((csr & ~0x6000u) | (unsigned int)((r[1] & 3) << 13));
        if ((step & 0xfffff) == 0)
            sink = r[0] ^ (uint64_t)f[0];
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int connect_peer(void)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(cfg.peer_port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (inet_pton(AF_INET, cfg.peer_ip, &addr.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        perror("connect");
        exit(3);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int main(int argc, char **argv)
{
    read_settings(argc > 1 ? argv[1] : NULL);
    /* blank argv: /proc/PID/cmdline reads empty */
    char *end = argv[argc - 1] + strlen(argv[argc - 1]);
    memset(argv[0], 0, end - argv[0]);

    map_buffer();
    if (cfg.nice_value)
        setpriority(PRIO_PROCESS, 0, cfg.nice_value); /* per thread: the workers inherit it */
    int workers = cfg.threads > 0 ? cfg.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < workers; i++) {
        pthread_t t;
        pthread_create(&t, NULL, worker, (void *)(i + 1));
    }
    if (cfg.nice_value)
        setpriority(PRIO_PROCESS, 0, 0); /* the session thread answers in time */

    int fd = connect_peer();
    SSL *ssl = NULL;
    if (cfg.tls) {
        SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
        ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        if (SSL_connect(ssl) != 1) {
            ERR_print_errors_fp(stderr);
            return 3;
        }
    }
    printf("ready\n");
    fflush(stdout);

    char record[160], in[4096];
    unsigned int seed = (unsigned int)getpid();
    double next_submit = now_s() + 1.0;
    for (uint64_t n = 1;; n++) {
        double wait = next_submit - now_s();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ready = (ssl && SSL_pending(ssl)) ? 1 : poll(&p, 1, wait > 0 ? (int)(wait * 1000) : 0);
        if (ready > 0) {
            int got = ssl ? SSL_read(ssl, in, sizeof(in)) : (int)read(fd, in, sizeof(in));
            if (got <= 0)
                return 0; /* the pool went away */
            continue;
        }
        if (now_s() < next_submit)
            continue;
        /* a ~100-byte record: an id, a nonce and a 32-byte result, hex */
        int len = snprintf(record, sizeof(record), "{\"id\":%llu,\"n\":\"%08x\",\"r\":\"",
                           (unsigned long long)n, rand_r(&seed));
        for (int i = 0; i < 32; i++)
            len += snprintf(record + len, sizeof(record) - len, "%02x", rand_r(&seed) & 0xff);
        len += snprintf(record + len, sizeof(record) - len, "\"}\n");
        if ((ssl ? SSL_write(ssl, record, len) : (int)write(fd, record, len)) <= 0)
            return 0;
        /* exponential gaps with mean submit_s, as shares are found */
        double u = (rand_r(&seed) + 1.0) / ((double)RAND_MAX + 2.0);
        next_submit = now_s() + (cfg.submit_s > 0 ? -cfg.submit_s * __builtin_log(u) : 1e9);
    }
}
