/* syscall_loop.c - ns per syscall for the sensor's overhead benchmark.
 *   syscall_loop MODE COUNT [PATH]
 * MODE: getppid | read (1 byte of /dev/zero) | write (1 byte to /dev/null)
 *       | ioctl (RM_CONTROL on PATH, opened read-write) | close-bad (close(-1))
 *       | send (1 byte on a connected UDP socket to 127.0.0.1:PATH: no receiver thread, little noise)
 *       | send-gpu (the same after opening /dev/nvidiactl: a GPU holder's connection)
 *       | send-fault, send-gpu-fault (the same two, writing from a NULL buffer: the kernel
 *         fails the copy with EFAULT after the probes ran, so the syscall itself is cheap
 *         and the probes' share of each call is measured with less noise)
 *       | mmap (mmap + munmap of 4 KiB anonymous memory, no MAP_HUGETLB: the huge-page
 *         probe's flag test is all it pays; ns per pair)
 *       | mmap-einval (mmap of length 0: the kernel refuses it with EINVAL after the
 *         probes ran, so the probe's share of each call is measured with less noise)
 *       | send-pair (one process, two connected UDP sockets to 127.0.0.1:PATH: the first
 *         connected before the process opens /dev/nvidiactl, so it has no activity record,
 *         the second after, so it has one; blocks of writes alternate between the two and
 *         each block is timed, so drift hits both alike.  A 5th argument "fault" writes
 *         from a NULL buffer, as above.)
 *       | mmap-pair (one process: blocks of mmap(len 0) alternate with blocks of munmap(len 0);
 *         both fail with EINVAL at once and only mmap has a probe, so the per-block-pair
 *         difference moves by the huge-page probe's cost when it is attached)
 * Prints one line: "<ns per call>"; mmap-pair prints "<mmap ns> <munmap ns> <median difference>"; send-pair prints "<record ns> <plain ns> <median of
 * per-block-pair differences, ns>".
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* NULL, hidden from the compiler's non-null check: the "fault" writes. */
static const char *volatile no_buffer;

static int udp_to(const char *port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -1;
    return fd;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define PAIR_BLOCK 2000

/* Alternates timed blocks of PAIR_BLOCK calls of side 1 and side 0 (the order flips every
 * block, so drift hits both alike) and prints "<side 1 ns> <side 0 ns> <median per-block
 * difference, ns>". */
static void timed_pair(long n, void (*call)(int side, void *ctx), void *ctx)
{
    long blocks = n / PAIR_BLOCK / 2;
    if (blocks < 1)
        blocks = 1;
    double *per[2] = { calloc(blocks, sizeof(double)), calloc(blocks, sizeof(double)) };
    double *diff = calloc(blocks, sizeof(double));
    for (long b = 0; b < blocks; b++) {
        for (int turn = 0; turn < 2; turn++) {
            int side = turn ^ (int)(b & 1);
            double t0 = now_ns();
            for (int i = 0; i < PAIR_BLOCK; i++)
                call(side, ctx);
            per[side][b] = (now_ns() - t0) / PAIR_BLOCK;
        }
        diff[b] = per[1][b] - per[0][b];
    }
    qsort(per[1], blocks, sizeof(double), by_value);
    qsort(per[0], blocks, sizeof(double), by_value);
    qsort(diff, blocks, sizeof(double), by_value);
    printf("%.1f %.1f %.1f\n", per[1][blocks / 2], per[0][blocks / 2], diff[blocks / 2]);
}

struct send_pair { int fd[2]; const char *buf; };   /* fd[1] has an activity record, fd[0] not */

static void send_one(int side, void *ctx)
{
    struct send_pair *p = ctx;
    write(p->fd[side], p->buf, 1);
}

static int send_pair(long n, const char *port, int fault)
{
    static char byte;
    struct send_pair p = { .buf = fault ? no_buffer : &byte };
    p.fd[0] = udp_to(port);
    if (p.fd[0] < 0 || open("/dev/nvidiactl", O_RDWR) < 0)
        return 3;
    p.fd[1] = udp_to(port);
    if (p.fd[1] < 0)
        return 3;
    for (int i = 0; i < 16; i++) {      /* past the captured first writes of both */
        send_one(0, &p);
        send_one(1, &p);
    }
    timed_pair(n, send_one, &p);
    return 0;
}

/* Side 1: mmap(len 0), side 0: munmap(len 0); both fail with EINVAL at once, only mmap has a probe. */
static void mmap_one(int side, void *ctx)
{
    (void)ctx;
    if (side)
        mmap(NULL, 0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    else
        munmap(NULL, 0);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    long n = strtol(argv[2], NULL, 0);
    if (!strcmp(mode, "mmap-pair")) {
        timed_pair(n, mmap_one, NULL);
        return 0;
    }
    if (!strcmp(mode, "send-pair"))
        return argc > 3 ? send_pair(n, argv[3], argc > 4 && !strcmp(argv[4], "fault")) : 2;
    int fd = -1;
    char buf[64] = {0};
    if (!strcmp(mode, "read"))
        fd = open("/dev/zero", O_RDONLY);
    else if (!strcmp(mode, "write"))
        fd = open("/dev/null", O_WRONLY);
    else if (!strcmp(mode, "ioctl"))
        fd = open(argc > 3 ? argv[3] : "/dev/null", O_RDWR);
    else if (!strncmp(mode, "send", 4)) {
        if (!strncmp(mode, "send-gpu", 8) && open("/dev/nvidiactl", O_RDWR) < 0)
            return 3;
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(argc > 3 ? atoi(argv[3]) : 9) };
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
            return 3;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (!strcmp(mode, "getppid"))
            getppid();
        else if (mode[0] == 'r')
            read(fd, buf, 1);
        else if (strstr(mode, "-fault"))
            write(fd, no_buffer, 1);
        else if (mode[0] == 'w' || mode[0] == 's')
            write(fd, buf, 1);
        else if (mode[0] == 'i')
            ioctl(fd, 0xc020462aUL, buf);
        else if (!strcmp(mode, "mmap-einval"))
            mmap(NULL, 0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        else if (mode[0] == 'm')
            munmap(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), 4096);
        else
            close(-1);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    printf("%.1f\n", ns);
    return 0;
}
