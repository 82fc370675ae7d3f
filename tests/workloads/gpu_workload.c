/* gpu_workload.c - a scripted workload for the sensor tests.
 *
 * Each argument is one step, run in order; fds opened or connected are
 * numbered from 0 in the order they were made:
 *   open:PATH               open PATH read-write (falls back to read-only)
 *   openat:DIR:NAME         open NAME relative to directory DIR
 *   flood-open:PATH:N       open and close PATH N times
 *   ioctl:I:CMD:N           N ioctls with command CMD (hex or decimal) on fd I
 *   xfer:I:INNER:N          N NVIDIA IOCTL_XFER_CMD ioctls wrapping INNER on fd I
 *   dup:I                   dup fd I (the copy gets the next number)
 *   close:I                 close fd I
 *   connect:ADDR:PORT       TCP connect to an IPv4 or IPv6 address
 *   send:I:HEX              write() the bytes to fd I
 *   sendto:I:HEX            send() the bytes to fd I
 *   sendmsg:I:HEX           sendmsg() the bytes to fd I
 *   writev:I:HEX            writev() the bytes to fd I (one iovec)
 *   hugemmap:BYTES:SHIFT    mmap(MAP_HUGETLB | SHIFT << MAP_HUGE_SHIFT; 0 = default page size) and touch it;
 *                           prints "hugemmap ok" or "hugemmap ERRNO" (a refusal is not a failure)
 *   hugeshm:BYTES           shmget(SHM_HUGETLB), attach, touch, mark for removal; prints like hugemmap
 *   spin:N                  start N threads that spin forever (a CPU miner's load)
 *   listen:PORT             listen on 127.0.0.1:PORT (a server: accepts nothing, connects nowhere)
 *   ready                   print "ready" on stdout and wait for a line on stdin
 *   sleep:MS                sleep
 *   exit:CODE               exit now with CODE
 * Any failing step exits with status 3 and a message on stderr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int fds[256];
static int nfds;

static void die(const char *step, const char *what)
{
    fprintf(stderr, "gpu_workload: %s: %s: %s\n", step, what, strerror(errno));
    exit(3);
}

static int fd_at(const char *step, const char *idx)
{
    int i = atoi(idx);
    if (i < 0 || i >= nfds)
        die(step, "no such fd index");
    return fds[i];
}

static size_t unhex(const char *hex, unsigned char *out, size_t cap)
{
    size_t n = 0;
    while (hex[0] && hex[1] && n < cap) {
        unsigned int b;
        sscanf(hex, "%2x", &b);
        out[n++] = (unsigned char)b;
        hex += 2;
    }
    return n;
}

static void push(int fd) { fds[nfds++] = fd; }

static void *spin(void *arg)
{
    volatile unsigned long n = 0;
    (void)arg;
    for (;;)
        n++;
    return NULL;
}

static void touch(char *p, size_t len)
{
    for (size_t i = 0; i < len; i += 4096)
        p[i] = 1;
}

int main(int argc, char **argv)
{
    static unsigned char buf[65536];
    for (int a = 1; a < argc; a++) {
        char step[4096];
        snprintf(step, sizeof(step), "%s", argv[a]);
        char *save = NULL;
        char *op = strtok_r(step, ":", &save);
        char *x = strtok_r(NULL, ":", &save);
        if (!op)
            continue;
        if (!strcmp(op, "open")) {
            int fd = open(x, O_RDWR | O_CLOEXEC);
            if (fd < 0)
                fd = open(x, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                die(argv[a], "open");
            push(fd);
        } else if (!strcmp(op, "openat")) {
            char *name = strtok_r(NULL, ":", &save);
            int dir = open(x, O_RDONLY | O_DIRECTORY);
            if (dir < 0)
                die(argv[a], "open dir");
            int fd = openat(dir, name, O_RDWR);
            if (fd < 0)
                die(argv[a], "openat");
            close(dir);
            push(fd);
        } else if (!strcmp(op, "flood-open")) {
            long n = strtol(strtok_r(NULL, ":", &save), NULL, 0);
            for (long i = 0; i < n; i++) {
                int fd = open(x, O_RDWR);
                if (fd < 0)
                    die(argv[a], "open");
                close(fd);
            }
        } else if (!strcmp(op, "ioctl") || !strcmp(op, "xfer")) {
            int fd = fd_at(argv[a], x);
            unsigned long cmd = strtoul(strtok_r(NULL, ":", &save), NULL, 0);
            long n = strtol(strtok_r(NULL, ":", &save), NULL, 0);
            struct { uint32_t cmd; uint32_t size; uint64_t ptr; } xfer = { (uint32_t)cmd, 0, (uint64_t)(uintptr_t)buf };
            /* _IOWR('F', 211, 16-byte struct) */
            unsigned long outer = (3UL << 30) | (16UL << 16) | (0x46UL << 8) | 211UL;
            for (long i = 0; i < n; i++) {
                if (!strcmp(op, "xfer"))
                    ioctl(fd, outer, &xfer);
                else
                    ioctl(fd, cmd, buf);   /* ENOTTY on the test's null-backed nodes */
            }
        } else if (!strcmp(op, "dup")) {
            int fd = dup(fd_at(argv[a], x));
            if (fd < 0)
                die(argv[a], "dup");
            push(fd);
        } else if (!strcmp(op, "close")) {
            close(fd_at(argv[a], x));
        } else if (!strcmp(op, "connect")) {
            /* ADDR may be IPv6 with colons: the port is after the last ':' of argv. */
            char *full = argv[a] + strlen("connect:");
            char *colon = strrchr(full, ':');
            char addr[128];
            snprintf(addr, sizeof(addr), "%.*s", (int)(colon - full), full);
            int port = atoi(colon + 1);
            struct sockaddr_storage ss;
            memset(&ss, 0, sizeof(ss));
            socklen_t len;
            int family;
            if (strchr(addr, ':')) {
                struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
                s6->sin6_family = AF_INET6;
                s6->sin6_port = htons(port);
                inet_pton(AF_INET6, addr, &s6->sin6_addr);
                len = sizeof(*s6);
                family = AF_INET6;
            } else {
                struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
                s4->sin_family = AF_INET;
                s4->sin_port = htons(port);
                inet_pton(AF_INET, addr, &s4->sin_addr);
                len = sizeof(*s4);
                family = AF_INET;
            }
            int fd = socket(family, SOCK_STREAM, 0);
            if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) < 0)
                die(argv[a], "connect");
            push(fd);
        } else if (!strcmp(op, "send") || !strcmp(op, "sendto") || !strcmp(op, "sendmsg") || !strcmp(op, "writev")) {
            int fd = fd_at(argv[a], x);
            char *hex = strtok_r(NULL, ":", &save);
            size_t n = unhex(hex ? hex : "", buf, sizeof(buf));
            ssize_t r;
            struct iovec iov = { buf, n };
            struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
            if (!strcmp(op, "send"))
                r = write(fd, buf, n);
            else if (!strcmp(op, "sendto"))
                r = send(fd, buf, n, 0);
            else if (!strcmp(op, "sendmsg"))
                r = sendmsg(fd, &mh, 0);
            else
                r = writev(fd, &iov, 1);
            if (r < 0)
                die(argv[a], "send");
        } else if (!strcmp(op, "hugemmap")) {
            size_t len = strtoull(x, NULL, 0);
            int shift = atoi(strtok_r(NULL, ":", &save));
            char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (shift << 26), -1, 0);
            if (p == MAP_FAILED) {
                printf("hugemmap %d\n", errno);
            } else {
                touch(p, len);
                printf("hugemmap ok\n");
            }
            fflush(stdout);
        } else if (!strcmp(op, "hugeshm")) {
            size_t len = strtoull(x, NULL, 0);
            int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600 | SHM_HUGETLB);
            char *p = id < 0 ? (char *)-1 : shmat(id, NULL, 0);
            if (p == (char *)-1) {
                printf("hugeshm %d\n", errno);
            } else {
                shmctl(id, IPC_RMID, NULL);   /* freed when this process detaches (exits) */
                touch(p, len);
                printf("hugeshm ok\n");
            }
            fflush(stdout);
        } else if (!strcmp(op, "spin")) {
            for (int i = 0; i < atoi(x); i++) {
                pthread_t t;
                if (pthread_create(&t, NULL, spin, NULL))
                    die(argv[a], "pthread_create");
            }
        } else if (!strcmp(op, "listen")) {
            struct sockaddr_in s4 = { .sin_family = AF_INET, .sin_port = htons(atoi(x)) };
            inet_pton(AF_INET, "127.0.0.1", &s4.sin_addr);
            int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
            if (fd < 0 || bind(fd, (struct sockaddr *)&s4, sizeof(s4)) < 0 || listen(fd, 8) < 0)
                die(argv[a], "listen");
            push(fd);
        } else if (!strcmp(op, "ready")) {
            printf("ready\n");
            fflush(stdout);
            char line[16];
            if (!fgets(line, sizeof(line), stdin))
                return 0;
        } else if (!strcmp(op, "sleep")) {
            struct timespec ts = { atoi(x) / 1000, (atoi(x) % 1000) * 1000000L };
            nanosleep(&ts, NULL);
        } else if (!strcmp(op, "exit")) {
            exit(atoi(x));
        } else {
            errno = EINVAL;
            die(argv[a], "unknown step");
        }
    }
    return 0;
}
