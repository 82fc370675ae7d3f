/* rounding_benign.c - benign programs that switch the SSE rounding mode on purpose, for the
 * detection tests: none of them may be taken for RandomX.
 *
 *     rounding_benign MODE [QUEUE_PORT HEARTBEAT_S]
 *
 * MODE, each on one worker thread that never sleeps:
 *   interval        interval arithmetic as boost::interval and CGAL do it: around each
 *                   operation the mode goes to round-down for the lower bound, round-up for the
 *                   upper bound and back to nearest (toward zero is never used)
 *   set-once        a long computation (~1.5 s) in round-down for a guaranteed lower bound,
 *                   then back to nearest for ~0.5 s of ordinary work, over and over
 *   stepping        a libm test suite in glibc's shape: for each function, the whole table of
 *                   inputs in one mode after the other (nearest, toward zero, down, up), the
 *                   mode set before each call and restored after it, each result checked in
 *                   the mode it was computed in; a table takes ~1 ms
 *   stepping-slow   the same with long tables (~200 ms per function and mode, as TestFloat's
 *                   levels run)
 * With QUEUE_PORT the main thread holds a job-queue session to 127.0.0.1:QUEUE_PORT: it asks
 * for work, reports what it finished at most every 5 s, and sends a heartbeat every HEARTBEAT_S
 * seconds, each line answered by one line (request/reply: the queue never pushes).  Prints "ready" once
 * working.  Build with -frounding-math (the compiler must not move arithmetic across
 * fesetround) and -lm.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fenv.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *mode_name;
static volatile uint64_t jobs_done;
static volatile double sink;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* [lo, hi] enclosures of a polynomial over random points, one bound per rounding direction;
 * a job lasts ~5 s */
static void interval_job(uint64_t *seed)
{
    double width = 0;
    for (double end = now_s() + 5.0; now_s() < end;)
        for (int k = 0; k < 20000; k++) {
            volatile double a = (double)(next_random(seed) % 100000) / 7.0, b = 1.0 / 3.0;
            fesetround(FE_DOWNWARD);
            double lo = a * b + a * a * b - 1.0 / (a + 1.0);
            fesetround(FE_UPWARD);
            double hi = a * b + a * a * b - 1.0 / (a + 1.0);
            fesetround(FE_TONEAREST);
            width += hi - lo;
        }
    sink = width;
}

static void set_once_job(uint64_t *seed)
{
    volatile double sum = 0;
    fesetround(FE_DOWNWARD);
    for (double end = now_s() + 1.5; now_s() < end;)
        for (int k = 1; k < 20000; k++)
            sum += 1.0 / (double)(k + (next_random(seed) & 7));
    fesetround(FE_TONEAREST);
    for (double end = now_s() + 0.5; now_s() < end;)
        for (int k = 1; k < 20000; k++)
            sum += sqrt((double)k);
    sink = sum;
}

typedef double (*fn)(double);
static const fn functions[] = {sin, cos, exp, log1p, atan, cbrt, tanh, expm1};
static const int modes[] = {FE_TONEAREST, FE_TOWARDZERO, FE_DOWNWARD, FE_UPWARD};
#define TABLE 4096
static double inputs[TABLE], expected[8][4][TABLE];

static void stepping_job(double block_s)
{
    uint64_t failures = 0;
    for (int f = 0; f < 8; f++)
        for (int m = 0; m < 4; m++) {
            double end = now_s() + block_s;
            do {
                for (int i = 0; i < TABLE; i++) {
                    fesetround(modes[m]);
                    volatile double y = functions[f](inputs[i]);
                    /* checked in the mode it was computed in, as glibc's check_float is */
                    failures += fabs(y - expected[f][m][i]) > 1e-9 * (fabs(y) + 1.0);
                    fesetround(FE_TONEAREST);
                }
            } while (block_s > 0.01 && now_s() < end);
        }
    sink = (double)failures;
}

static void *worker(void *arg)
{
    (void)arg;
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    for (;;) {
        if (!strcmp(mode_name, "interval"))
            interval_job(&seed);
        else if (!strcmp(mode_name, "set-once"))
            set_once_job(&seed);
        else
            stepping_job(!strcmp(mode_name, "stepping-slow") ? 0.2 : 0.0);
        __atomic_add_fetch(&jobs_done, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int send_line(int fd, const char *line)
{
    char reply[256];
    if (write(fd, line, strlen(line)) <= 0)
        return -1;
    return read(fd, reply, sizeof(reply)) > 0 ? 0 : -1; /* one answer per line */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s interval|set-once|stepping|stepping-slow [PORT HEARTBEAT_S]\n",
                argv[0]);
        return 2;
    }
    mode_name = argv[1];
    uint64_t seed = 12345;
    for (int i = 0; i < TABLE; i++)
        inputs[i] = (double)(next_random(&seed) % 2000000) / 1000000.0 + 0.001;
    for (int f = 0; f < 8; f++)
        for (int m = 0; m < 4; m++)
            for (int i = 0; i < TABLE; i++) {
                fesetround(modes[m]);
                expected[f][m][i] = functions[f](inputs[i]);
            }
    fesetround(FE_TONEAREST);
    int fd = -1;
    double heartbeat_s = argc > 3 ? atof(argv[3]) : 30.0;
    if (argc > 2) {
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
        int one = 1;
        inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
            perror("connect");
            return 3;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (send_line(fd, "NEXT\n") < 0)
            return 3;
    }
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    printf("ready\n");
    fflush(stdout);
    uint64_t reported = 0, beats = 0;
    double next_beat = now_s() + heartbeat_s, next_report = now_s() + 5.0;
    for (;;) {
        usleep(200000);
        if (fd < 0)
            continue;
        char line[64];
        if (jobs_done != reported && now_s() >= next_report) { /* results in batches */
            next_report = now_s() + 5.0;
            reported = jobs_done;
            snprintf(line, sizeof(line), "DONE %llu\n", (unsigned long long)reported);
            if (send_line(fd, line) < 0 || send_line(fd, "NEXT\n") < 0)
                return 0; /* the queue went away */
        }
        if (now_s() >= next_beat) {
            snprintf(line, sizeof(line), "BEAT %llu\n", (unsigned long long)++beats);
            if (send_line(fd, line) < 0)
                return 0;
            next_beat += heartbeat_s;
        }
    }
}
