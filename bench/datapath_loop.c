/* New flows as fast as one thread can open them: the sender and the responder of bench/datapath.py.
 *
 *   datapath_loop serve-tcp ADDR PORT          accept() and close() forever
 *   datapath_loop serve-udp ADDR PORT          echo every datagram back
 *   datapath_loop tcp ADDR PORT SECONDS        connect() then close with RST, one at a time
 *   datapath_loop udp ADDR PORT SECONDS        a new socket (fresh source port) per query, wait for the echo
 *
 * A client prints one line: "count=N errors=E seconds=S p50_us=X p99_us=Y", the latencies being
 * connect() (TCP: SYN to SYN-ACK) or send-to-echo (UDP) of each new flow. Closing a TCP
 * connection with SO_LINGER 0 sends a RST, so neither side keeps a TIME_WAIT socket and the
 * client's ports never run out. Written in C so that the sender's own cost per flow (a few
 * microseconds) does not hide the cost the node's rules add to each new flow's first packet.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES (20 * 1000 * 1000)

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

static int serve_tcp(struct sockaddr_in sa) {
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 4096)) {
        perror("serve-tcp");
        return 1;
    }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c >= 0) close(c);
    }
}

static int serve_udp(struct sockaddr_in sa) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa)) {
        perror("serve-udp");
        return 1;
    }
    char buf[512];
    for (;;) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t n = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
        if (n > 0) sendto(s, buf, (size_t)n, 0, (struct sockaddr *)&from, len);
    }
}

/* One new flow; returns its latency in seconds, or a negative number on failure. */
static double tcp_flow(struct sockaddr_in sa) {
    struct linger rst = {1, 0};
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return -1;
    setsockopt(s, SOL_SOCKET, SO_LINGER, &rst, sizeof rst);
    double t = now();
    int rc = connect(s, (struct sockaddr *)&sa, sizeof sa);
    t = now() - t;
    close(s);
    return rc == 0 ? t : -1;
}

static double udp_flow(struct sockaddr_in sa) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) return -1;
    char buf[64] = "datapath";
    struct pollfd p = {s, POLLIN, 0};
    double t = now();
    int ok = connect(s, (struct sockaddr *)&sa, sizeof sa) == 0 && send(s, buf, 8, 0) == 8 && poll(&p, 1, 1000) == 1 &&
             recv(s, buf, sizeof buf, 0) == 8;
    t = now() - t;
    close(s);
    return ok ? t : -1;
}

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int client(int udp, struct sockaddr_in sa, double seconds) {
    float *lat = malloc(sizeof(float) * MAX_SAMPLES);
    long count = 0, errors = 0;
    double start = now(), end = start + seconds, t;
    while ((t = now()) < end && count < MAX_SAMPLES) {
        double l = udp ? udp_flow(sa) : tcp_flow(sa);
        if (l < 0) {
            errors++;
            continue;
        }
        lat[count++] = (float)(l * 1e6);
    }
    double elapsed = now() - start;
    qsort(lat, (size_t)count, sizeof(float), cmp);
    double p50 = count ? lat[count / 2] : 0, p99 = count ? lat[count * 99 / 100] : 0;
    printf("count=%ld errors=%ld seconds=%.6f p50_us=%.2f p99_us=%.2f\n", count, errors, elapsed, p50, p99);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "serve-tcp")) return serve_tcp(address(argv[2], argv[3]));
    if (argc >= 4 && !strcmp(argv[1], "serve-udp")) return serve_udp(address(argv[2], argv[3]));
    if (argc >= 5 && (!strcmp(argv[1], "tcp") || !strcmp(argv[1], "udp")))
        return client(!strcmp(argv[1], "udp"), address(argv[2], argv[3]), atof(argv[4]));
    fprintf(stderr, "usage: %s serve-tcp|serve-udp ADDR PORT | tcp|udp ADDR PORT SECONDS\n", argv[0]);
    return 2;
}
