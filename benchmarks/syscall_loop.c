/* syscall_loop.c - ns per syscall for the sensor's overhead benchmark.
 *   syscall_loop MODE COUNT [PATH]
 * MODE: getppid | read (1 byte of /dev/zero) | write (1 byte to /dev/null)
 *       | ioctl (RM_CONTROL on PATH, opened read-write) | close-bad (close(-1))
 *       | send (1 byte on a connected UDP socket to 127.0.0.1:PATH: no receiver thread, little noise)
 *       | send-gpu (the same after opening /dev/nvidiactl: a GPU holder's connection)
 * Prints one line: "<ns per call>".
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    long n = strtol(argv[2], NULL, 0);
    int fd = -1;
    char buf[64] = {0};
    if (!strcmp(mode, "read"))
        fd = open("/dev/zero", O_RDONLY);
    else if (!strcmp(mode, "write"))
        fd = open("/dev/null", O_WRONLY);
    else if (!strcmp(mode, "ioctl"))
        fd = open(argc > 3 ? argv[3] : "/dev/null", O_RDWR);
    else if (!strncmp(mode, "send", 4)) {
        if (!strcmp(mode, "send-gpu") && open("/dev/nvidiactl", O_RDWR) < 0)
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
        else if (mode[0] == 'w' || mode[0] == 's')
            write(fd, buf, 1);
        else if (mode[0] == 'i')
            ioctl(fd, 0xc020462aUL, buf);
        else
            close(-1);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    printf("%.1f\n", ns);
    return 0;
}
