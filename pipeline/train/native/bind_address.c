/* LD_PRELOAD shim for TensorFlow's gRPC server: TensorFlow binds its worker server to the wildcard
 * address (all interfaces) whatever TF_CONFIG says. With DEEPSPEECH_BIND_ADDRESS set (an IPv4 or IPv6
 * literal), every bind() to the wildcard address is redirected to that address instead; other binds
 * are untouched. An IPv6 wildcard socket bound for an IPv4 address gets the IPv4-mapped form, which a
 * dual-stack socket accepts. Built by pipeline/bind_address.py with the system C compiler. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind)
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *host = getenv("DEEPSPEECH_BIND_ADDRESS");
    if (host && *host && addr) {
        struct in_addr v4;
        struct in6_addr v6;
        int is_v4 = inet_pton(AF_INET, host, &v4) == 1;
        int is_v6 = !is_v4 && inet_pton(AF_INET6, host, &v6) == 1;
        if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in) && is_v4) {
            struct sockaddr_in in = *(const struct sockaddr_in *)addr;
            if (in.sin_addr.s_addr == htonl(INADDR_ANY)) {
                in.sin_addr = v4;
                return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
            }
        } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6) && (is_v4 || is_v6)) {
            struct sockaddr_in6 in6 = *(const struct sockaddr_in6 *)addr;
            if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
                if (is_v4) {
                    memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
                    in6.sin6_addr.s6_addr[10] = 0xff;
                    in6.sin6_addr.s6_addr[11] = 0xff;
                    memcpy(&in6.sin6_addr.s6_addr[12], &v4, 4);
                } else {
                    in6.sin6_addr = v6;
                }
                return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
            }
        }
    }
    return real_bind(fd, addr, len);
}
