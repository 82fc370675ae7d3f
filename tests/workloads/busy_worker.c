/* A benign busy worker in C: one core of real work beside a long, quiet session to a server.
 *
 *   busy_worker beanstalkd PORT   SHA-256 over buffers (OpenSSL); a thread blocks in beanstalkd's
 *                                 `reserve` and deletes each job the queue hands it
 *   busy_worker memcached PORT [S]  zlib deflate of a text-like buffer; a heartbeat key set
 *                                 through libmemcached every S s (60) on the one connection
 *   busy_worker redis PORT        Jacobi sweeps of a 2-D heat grid (libm); a thread blocks in
 *                                 BLPOP (hiredis) and takes each job pushed on "jobs"
 *
 * Prints "ready" once its session is open, then works until killed.  tests/test_busy_workers.py.
 */
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>
#include <math.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static int port;
static double heartbeat_s = 60;
static volatile unsigned long jobs_done;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "busy_worker: %s\n", what);
    exit(1);
}

/* ---- beanstalkd: raw protocol (the server is Debian's; the protocol is three lines) ---- */
static int line_in(int fd, char *buf, size_t size) {
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t got = read(fd, buf + n, 1);
        if (got <= 0) return -1;
        if (buf[n++] == '\n') break;
    }
    buf[n] = 0;
    return (int)n;
}

static void *beanstalk_reserve(void *arg) {
    int fd = *(int *)arg;
    char line[256], body[4096];
    for (;;) {
        if (write(fd, "reserve\r\n", 9) != 9) return NULL;
        if (line_in(fd, line, sizeof line) < 0) return NULL;
        unsigned long id = 0, bytes = 0;
        if (sscanf(line, "RESERVED %lu %lu", &id, &bytes) != 2) continue;
        size_t want = bytes + 2, got = 0;
        while (got < want && got < sizeof body) {
            ssize_t n = read(fd, body + got, want - got);
            if (n <= 0) return NULL;
            got += n;
        }
        int len = snprintf(line, sizeof line, "delete %lu\r\n", id);
        if (write(fd, line, len) != len || line_in(fd, line, sizeof line) < 0) return NULL;
        jobs_done++;
    }
}

static void run_beanstalkd(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("beanstalkd: connect");
    char line[256];
    if (write(fd, "watch jobs\r\n", 12) != 12 || line_in(fd, line, sizeof line) < 0) die("watch");
    pthread_t t;
    pthread_create(&t, NULL, beanstalk_reserve, &fd);
    puts("ready");
    fflush(stdout);
    unsigned char buf[1 << 16], digest[EVP_MAX_MD_SIZE];
    unsigned int len;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (;;) {
        EVP_Digest(buf, sizeof buf, digest, &len, EVP_sha256(), NULL);
        memcpy(buf, digest, len); /* chain: each block depends on the last digest */
    }
}

/* ---- memcached: libmemcached, one persistent connection, a heartbeat a minute ---- */
static void run_memcached(void) {
    memcached_st *mc = memcached_create(NULL);
    memcached_server_add(mc, "127.0.0.1", (in_port_t)port);
    char value[64];
    int len = snprintf(value, sizeof value, "%.0f", now_s());
    if (memcached_set(mc, "worker:heartbeat", 16, value, len, 0, 0) != MEMCACHED_SUCCESS)
        die("memcached: set");
    puts("ready");
    fflush(stdout);
    static char text[1 << 18];
    static unsigned char out[(1 << 18) + 4096];
    const char *words[] = {"order ", "invoice ", "customer ", "shipped ", "2026-12-02 ", "total "};
    size_t n = 0;
    unsigned seed = 7;
    while (n + 16 < sizeof text) {
        seed = seed * 1103515245 + 12345;
        const char *w = words[(seed >> 16) % 6];
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%u\n", w, seed % 9973);
    }
    double next = now_s() + heartbeat_s;
    for (;;) {
        uLongf outlen = sizeof out;
        compress2(out, &outlen, (const Bytef *)text, n, 6);
        text[outlen % n] ^= 1; /* the next buffer differs */
        if (now_s() >= next) {
            len = snprintf(value, sizeof value, "%.0f", now_s());
            memcached_set(mc, "worker:heartbeat", 16, value, len, 0, 0);
            next += heartbeat_s;
        }
    }
}

/* ---- redis: hiredis, a thread blocked in BLPOP; Jacobi sweeps on the main thread ---- */
static void *redis_blpop(void *arg) {
    redisContext *rc = arg;
    for (;;) {
        redisReply *r = redisCommand(rc, "BLPOP jobs 0");
        if (r == NULL) return NULL;
        freeReplyObject(r);
        jobs_done++;
    }
}

static void run_redis(void) {
    redisContext *rc = redisConnect("127.0.0.1", port);
    if (rc == NULL || rc->err) die("redis: connect");
    redisReply *r = redisCommand(rc, "PING");
    if (r == NULL) die("redis: ping");
    freeReplyObject(r);
    pthread_t t;
    pthread_create(&t, NULL, redis_blpop, rc);
    puts("ready");
    fflush(stdout);
    enum { N = 160 };
    static double a[N][N], b[N][N];
    for (int i = 0; i < N; i++) a[i][0] = b[i][0] = 100.0 * sin(i * M_PI / N);
    for (;;) {
        for (int i = 1; i < N - 1; i++)
            for (int j = 1; j < N - 1; j++)
                b[i][j] = 0.25 * (a[i - 1][j] + a[i + 1][j] + a[i][j - 1] + a[i][j + 1]);
        for (int i = 1; i < N - 1; i++)
            for (int j = 1; j < N - 1; j++)
                a[i][j] = 0.25 * (b[i - 1][j] + b[i + 1][j] + b[i][j - 1] + b[i][j + 1]);
        if (fabs(a[N / 2][1]) > 1e300) a[N / 2][1] = 0; /* keeps the compiler from dropping it */
    }
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) die("usage: busy_worker beanstalkd|memcached|redis PORT [S]");
    port = atoi(argv[2]);
    if (argc == 4) heartbeat_s = atof(argv[3]);
    if (strcmp(argv[1], "beanstalkd") == 0) run_beanstalkd();
    if (strcmp(argv[1], "memcached") == 0) run_memcached();
    if (strcmp(argv[1], "redis") == 0) run_redis();
    die("unknown kind");
}
