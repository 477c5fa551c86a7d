/* The end-to-end senders of bench/userspace.py (the responders and the UDP loop are bench/datapath_loop.c's).
 *
 *   userspace_loop serve-sink ADDR PORT         read each connection to its end, then close it
 *   userspace_loop bulk ADDR PORT SECONDS       one connection, 1 MiB writes for SECONDS, then half-close
 *                                               and wait for the server's close: prints bytes and seconds
 *   userspace_loop tcp-rr ADDR PORT SECONDS     connect, read until the server's close, close; one at a time
 *
 * tcp-rr waits for the pod's close (datapath_loop serve-tcp accepts and closes at once), not just
 * for the SYN-ACK: a relay completes the client's handshake itself, before it has reached the pod,
 * so only the end of the exchange says the connection got through. Latency: connect() to EOF.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES (10 * 1000 * 1000)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct sockaddr_in address(const char *ip, const char *port) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)atoi(port));
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
        fprintf(stderr, "not an IPv4 address: %s\n", ip);
        exit(2);
    }
    return sa;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int serve_sink(struct sockaddr_in sa) {
    static char buf[1 << 20];
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 128)) {
        perror("serve-sink");
        return 1;
    }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        while (read(c, buf, sizeof buf) > 0) {}
        close(c);
    }
}

static int bulk(struct sockaddr_in sa, double seconds) {
    static char buf[1 << 20];
    memset(buf, 'x', sizeof buf);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
        perror("bulk connect");
        return 1;
    }
    double start = now(), end = start + seconds;
    long long sent = 0;
    while (now() < end) {
        ssize_t n = write(s, buf, sizeof buf);
        if (n <= 0) {
            perror("bulk write");
            return 1;
        }
        sent += n;
    }
    shutdown(s, SHUT_WR);
    while (read(s, buf, sizeof buf) > 0) {}  /* the sink has read everything once it closes */
    printf("bytes=%lld seconds=%.6f\n", sent, now() - start);
    close(s);
    return 0;
}

static int tcp_rr(struct sockaddr_in sa, double seconds) {
    static double samples[MAX_SAMPLES];
    char byte;
    long count = 0, errors = 0;
    double start = now(), end = start + seconds;
    while (now() < end && count < MAX_SAMPLES) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        double t = now();
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0 && read(s, &byte, 1) == 0) {
            samples[count++] = (now() - t) * 1e6;
        } else {
            errors++;
        }
        close(s);
    }
    double elapsed = now() - start;
    qsort(samples, count, sizeof samples[0], cmp);
    printf("count=%ld errors=%ld seconds=%.6f p50_us=%.1f p99_us=%.1f\n", count, errors, elapsed,
           count ? samples[count / 2] : 0.0, count ? samples[(long)(count * 0.99)] : 0.0);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 4 && strcmp(argv[1], "serve-sink") == 0) return serve_sink(address(argv[2], argv[3]));
    if (argc == 5 && strcmp(argv[1], "bulk") == 0) return bulk(address(argv[2], argv[3]), atof(argv[4]));
    if (argc == 5 && strcmp(argv[1], "tcp-rr") == 0) return tcp_rr(address(argv[2], argv[3]), atof(argv[4]));
    fprintf(stderr, "usage: userspace_loop serve-sink ADDR PORT | bulk ADDR PORT SECONDS | tcp-rr ADDR PORT SECONDS\n");
    return 2;
}
