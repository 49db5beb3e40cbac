/* The guest agent's first stage: a small static program, the sandbox's first process, that
 * dials the host and serves the first command while the Python agent is still starting.
 *
 * Why: a cold sandbox's first command used to wait for a Python interpreter and the agent's
 * imports inside gVisor (about 100 ms on a quiet host); this program is up in about a
 * millisecond. It is built from this file at image-build time (Debian's gcc, statically
 * linked) and installed as /opt/aamp/agent-init; the gVisor driver starts it as
 *
 *     /opt/aamp/agent-init /opt/aamp/agent --connect unix:... [--egress unix:...] [...]
 *
 * What it does, in order:
 *  1. with --egress, binds the guest's egress forwarder address (127.0.0.1:3128) at once, so a
 *     first command's connections queue there until the Python forwarder accepts them;
 *  2. forks the Python agent (the AGENT argument, with the same options plus --handoff-fd and
 *     --forwarder-fd), which dials its own connections as always once it is let start (see
 *     `agent_go`: after the first command, not alongside it);
 *  3. dials one channel connection and sends the agent's hello (with the agent's pid);
 *  4. when the request comes on that connection, dials a spare first, as the agent does, and
 *     hands it to the agent (an idle connection, its for the next request); then it
 *     serves the request itself if it is a plain exec (no stdin)
 *     whose every field it understands; anything else — another operation, stdin, a field it
 *     cannot read, a bad value, a program that cannot be started — it hands to the Python
 *     agent unchanged (the connection and the request frame, over --handoff-fd), which serves
 *     or refuses it exactly as it serves every other request;
 *  5. stays pid 1: reaps every orphan, passes SIGTERM/SIGINT on to the Python agent, and exits
 *     with its status.
 * An option it does not know (or --init, or a non-unix endpoint) makes it exec the Python
 * agent directly, which then behaves as without a first stage.
 *
 * The exec it serves follows `aamp.guest.exec_runner` exactly: the command in its own session,
 * stdout/stderr as STDOUT/STDERR frames of at most 64 KiB as they come, keepalives at the
 * request's heartbeat, the process group killed on a kill message, on the timeout or when the
 * host hangs up, output drained for 0.5 s after the exit, then one result message, then the
 * host closes. The framing and its limits are `aamp.guest.wire`'s (tests check the constants
 * match). Nothing here is trusted by the host: it validates every frame as it does the
 * Python agent's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AGENT_VERSION "0.1.0"
#define PROTOCOL_VERSION 1
#define MAX_PAYLOAD (1024 * 1024)
#define OUTPUT_CHUNK (64 * 1024)
#define DRAIN_GRACE 0.5
#define DRAIN_TIMEOUT 10.0
#define F_CONTROL 1
#define F_STDOUT 2
#define F_STDERR 3
#define F_STDIN 4
#define F_DATA 5
#define F_EOF 6
#define MAX_ARGS 4096
#define MAX_ENV 4096
#define MAX_DEPTH 64
#define HANDOFF_IDLE 0 /* a handed-over frame type: an idle connection, no request yet */
#define HANDOFF_FD 3
#define FORWARDER_FD 4

static const char *const BASE_ENV[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
};
static const char *const PROXY_ENV[] = {
    "HTTP_PROXY=http://127.0.0.1:3128", "HTTPS_PROXY=http://127.0.0.1:3128",
    "http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
    "NO_PROXY=localhost,127.0.0.1",     "no_proxy=localhost,127.0.0.1",
};

static volatile sig_atomic_t agent_pid = 0;
/* The Python agent is forked at once (its pid goes in every hello) but waits for this pipe to
 * close before it starts: inside a sandbox's CPU quota its start-up would compete with the
 * first command, so it starts once that command has exited, when a request comes that only
 * it can serve, or when no request came for IDLE_START_MS. */
static int agent_go = -1;
#define IDLE_START_MS 200
/* While the agent waits, these say it is needed: a request on the spare it was handed, or a
 * connection to the egress forwarder it runs. */
static int wake_fds[2] = {-1, -1};

static void release_agent(void) {
    if (agent_go >= 0) {
        close(agent_go);
        agent_go = -1;
    }
}
static int sigchld_pipe[2] = {-1, -1};

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("aamp-agent-init: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- bytes on a socket ------------------------------------------------------------- */

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n) { /* 0 ok, 1 clean EOF at start, -1 error */
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return got == 0 ? 1 : -1;
        got += (size_t)r;
    }
    return 0;
}

static int send_frame(int fd, int type, const void *payload, size_t n) {
    unsigned char h[5] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n, (unsigned char)type};
    if (write_all(fd, h, 5)) return -1;
    return n ? write_all(fd, payload, n) : 0;
}

static int send_control(int fd, const char *json) {
    return send_frame(fd, F_CONTROL, json, strlen(json));
}

/* One frame, its header checked before the payload is read (wire.parse_header, with the
 * guest's limit for host frames: MAX_PAYLOAD for every type). 0 ok, 1 clean EOF, -1 bad. */
static int recv_frame(int fd, int *type, char **payload, size_t *len) {
    unsigned char h[5];
    int r = read_all(fd, h, 5);
    if (r) return r;
    size_t n = ((size_t)h[0] << 24) | ((size_t)h[1] << 16) | ((size_t)h[2] << 8) | h[3];
    if (h[4] < F_CONTROL || h[4] > F_EOF || n > MAX_PAYLOAD || (h[4] == F_EOF && n)) return -1;
    char *buf = malloc(n + 1);
    if (!buf) return -1;
    if (n && read_all(fd, buf, n)) {
        free(buf);
        return -1;
    }
    buf[n] = 0;
    *type = h[4];
    *payload = buf;
    *len = n;
    return 0;
}

/* ---- a small JSON reader: just enough for an exec request ----------------------------
 * Any doubt (syntax it does not accept, a lone surrogate, bad UTF-8, deep nesting) returns
 * failure, and the request goes to the Python agent, whose json module decides. */

typedef struct {
    const char *p, *end;
} Json;

static void ws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned cp;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; }
        else return 0;
        if (i + k >= n) return 0;
        for (size_t m = 1; m <= k; m++) {
            if ((s[i + m] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + m] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* A string; with `out`, a malloc'd copy (NUL-terminated; *has_nul set if it holds a NUL). */
static int jstring(Json *j, char **out, int *has_nul) {
    if (j->p >= j->end || *j->p != '"') return -1;
    j->p++;
    size_t cap = 64, n = 0;
    char *s = out ? malloc(cap) : NULL;
    if (out && !s) return -1;
    if (has_nul) *has_nul = 0;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p;
        char enc[4];
        size_t k = 0;
        if (c < 0x20) goto fail;
        if (c == '\\') {
            if (j->end - j->p < 2) goto fail;
            char e = j->p[1];
            j->p += 2;
            switch (e) {
            case '"': enc[k++] = '"'; break;
            case '\\': enc[k++] = '\\'; break;
            case '/': enc[k++] = '/'; break;
            case 'b': enc[k++] = '\b'; break;
            case 'f': enc[k++] = '\f'; break;
            case 'n': enc[k++] = '\n'; break;
            case 'r': enc[k++] = '\r'; break;
            case 't': enc[k++] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (j->end - j->p < 4 || hex4(j->p, &cp)) goto fail;
                j->p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) goto fail;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                        hex4(j->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        goto fail;
                    j->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0 && has_nul) *has_nul = 1;
                if (cp < 0x80) enc[k++] = (char)cp;
                else if (cp < 0x800) {
                    enc[k++] = (char)(0xC0 | (cp >> 6));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    enc[k++] = (char)(0xE0 | (cp >> 12));
                    enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    enc[k++] = (char)(0xF0 | (cp >> 18));
                    enc[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default: goto fail;
            }
        } else {
            enc[k++] = (char)c;
            j->p++;
        }
        if (out) {
            if (n + k + 1 > cap) {
                cap = (n + k + 1) * 2;
                char *t = realloc(s, cap);
                if (!t) goto fail;
                s = t;
            }
            memcpy(s + n, enc, k);
        }
        n += k;
    }
    if (j->p >= j->end) goto fail;
    j->p++;
    if (out) {
        s[n] = 0;
        *out = s;
    }
    return 0;
fail:
    free(s);
    return -1;
}

/* A number as JSON writes it (no NaN/Infinity: the Python side refuses those too). */
static int jnumber(Json *j, double *out) {
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end) return -1;
    if (*j->p == '0') j->p++;
    else if (*j->p >= '1' && *j->p <= '9') while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    else return -1;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9') return -1;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (j->p >= j->end || *j->p < '0' || *j->p > '9') return -1;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    }
    if (j->p - s > 64) return -1;
    char tmp[80];
    memcpy(tmp, s, (size_t)(j->p - s));
    tmp[j->p - s] = 0;
    *out = strtod(tmp, NULL);
    return isfinite(*out) ? 0 : -1;
}

static int lit(Json *j, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n)) return -1;
    j->p += n;
    return 0;
}

static int jskip(Json *j, int depth) {
    if (depth > MAX_DEPTH) return -1;
    ws(j);
    if (j->p >= j->end) return -1;
    double d;
    switch (*j->p) {
    case '"': return jstring(j, NULL, NULL);
    case 't': return lit(j, "true");
    case 'f': return lit(j, "false");
    case 'n': return lit(j, "null");
    case '[':
    case '{': {
        char close = *j->p == '[' ? ']' : '}';
        int object = close == '}';
        j->p++;
        ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; return 0; }
        for (;;) {
            ws(j);
            if (object) {
                if (jstring(j, NULL, NULL)) return -1;
                ws(j);
                if (j->p >= j->end || *j->p != ':') return -1;
                j->p++;
            }
            if (jskip(j, depth + 1)) return -1;
            ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            if (j->p < j->end && *j->p == close) { j->p++; return 0; }
            return -1;
        }
    }
    default: return jnumber(j, &d);
    }
}

/* ---- the exec request ------------------------------------------------------------------ */

typedef struct {
    char *argv[MAX_ARGS + 1];
    int argc;
    char *env_keys[MAX_ENV], *env_vals[MAX_ENV];
    int envc;
    char *cwd;
    double timeout, heartbeat; /* < 0: none */
    int is_exec, is_kill, stdin_wanted, bad;
} Request;

static void free_request(Request *r) {
    for (int i = 0; i < r->argc; i++) free(r->argv[i]);
    for (int i = 0; i < r->envc; i++) { free(r->env_keys[i]); free(r->env_vals[i]); }
    free(r->cwd);
    memset(r, 0, sizeof *r);
}

static int opt_number(Json *j, double *out) { /* null -> -1; a positive number; else fail */
    ws(j);
    if (j->p < j->end && *j->p == 'n') { *out = -1; return lit(j, "null"); }
    if (jnumber(j, out) || !(*out > 0)) return -1;
    return 0;
}

/* Reads a control message; 0 if it is an object this program understands (`is_exec` says
 * whether it is an exec it can serve itself), -1 otherwise. */
static int parse_request(const char *buf, size_t n, Request *r) {
    memset(r, 0, sizeof *r);
    r->timeout = r->heartbeat = -1;
    if (!utf8_ok((const unsigned char *)buf, n)) return -1;
    Json j = {buf, buf + n};
    int saw_exec = 0;
    ws(&j);
    if (j.p >= j.end || *j.p != '{') return -1;
    j.p++;
    ws(&j);
    if (j.p < j.end && *j.p == '}') j.p++;
    else for (;;) {
        char *key = NULL;
        ws(&j);
        if (jstring(&j, &key, NULL)) return -1;
        ws(&j);
        if (j.p >= j.end || *j.p != ':') { free(key); return -1; }
        j.p++;
        ws(&j);
        int rc = 0;
        if (!strcmp(key, "op")) {
            char *op = NULL;
            rc = jstring(&j, &op, NULL);
            if (!rc) {
                saw_exec = !strcmp(op, "exec");
                r->is_kill = !strcmp(op, "kill");
                free(op);
            }
        } else if (!strcmp(key, "argv")) {
            for (int i = 0; i < r->argc; i++) free(r->argv[i]);
            r->argc = 0;
            rc = j.p < j.end && *j.p == '[' ? 0 : -1;
            if (!rc) {
                j.p++;
                ws(&j);
                if (j.p < j.end && *j.p == ']') j.p++;
                else for (;;) {
                    int nul;
                    ws(&j);
                    if (r->argc >= MAX_ARGS || jstring(&j, &r->argv[r->argc], &nul)) { rc = -1; break; }
                    r->argc++;
                    if (nul) r->bad = 1;
                    ws(&j);
                    if (j.p < j.end && *j.p == ',') { j.p++; continue; }
                    if (j.p < j.end && *j.p == ']') { j.p++; break; }
                    rc = -1;
                    break;
                }
            }
        } else if (!strcmp(key, "env")) {
            for (int i = 0; i < r->envc; i++) { free(r->env_keys[i]); free(r->env_vals[i]); }
            r->envc = 0;
            if (j.p < j.end && *j.p == 'n') rc = lit(&j, "null");
            else if (j.p < j.end && *j.p == '{') {
                j.p++;
                ws(&j);
                if (j.p < j.end && *j.p == '}') j.p++;
                else for (;;) {
                    int nk, nv;
                    char *k = NULL, *v = NULL;
                    ws(&j);
                    if (r->envc >= MAX_ENV || jstring(&j, &k, &nk)) { rc = -1; break; }
                    ws(&j);
                    if (j.p >= j.end || *j.p != ':') { free(k); rc = -1; break; }
                    j.p++;
                    ws(&j);
                    if (jstring(&j, &v, &nv)) { free(k); rc = -1; break; }
                    if (nk || nv || !*k || strchr(k, '=')) r->bad = 1;
                    /* a repeated name: the last one counts, as in a JSON object */
                    int at = r->envc;
                    for (int i = 0; i < r->envc; i++)
                        if (!strcmp(r->env_keys[i], k)) at = i;
                    if (at < r->envc) { free(r->env_keys[at]); free(r->env_vals[at]); }
                    else r->envc++;
                    r->env_keys[at] = k;
                    r->env_vals[at] = v;
                    ws(&j);
                    if (j.p < j.end && *j.p == ',') { j.p++; continue; }
                    if (j.p < j.end && *j.p == '}') { j.p++; break; }
                    rc = -1;
                    break;
                }
            } else rc = -1;
        } else if (!strcmp(key, "cwd")) {
            free(r->cwd);
            r->cwd = NULL;
            if (j.p < j.end && *j.p == 'n') rc = lit(&j, "null");
            else {
                int nul;
                rc = jstring(&j, &r->cwd, &nul);
                if (!rc && nul) r->bad = 1;
            }
        } else if (!strcmp(key, "stdin")) {
            if (j.p < j.end && *j.p == 't') { rc = lit(&j, "true"); r->stdin_wanted = 1; }
            else if (j.p < j.end && *j.p == 'f') { rc = lit(&j, "false"); r->stdin_wanted = 0; }
            else if (j.p < j.end && *j.p == 'n') { rc = lit(&j, "null"); r->stdin_wanted = 0; }
            else rc = -1; /* Python's bool() of anything else: let it decide */
        } else if (!strcmp(key, "timeout")) {
            rc = opt_number(&j, &r->timeout);
        } else if (!strcmp(key, "heartbeat")) {
            rc = opt_number(&j, &r->heartbeat);
        } else {
            rc = jskip(&j, 1);
        }
        free(key);
        if (rc) return -1;
        ws(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        if (j.p < j.end && *j.p == '}') { j.p++; break; }
        return -1;
    }
    ws(&j);
    if (j.p != j.end) return -1;
    r->is_exec = saw_exec && r->argc > 0 && !r->bad && !r->stdin_wanted;
    return 0;
}

/* ---- running one command ------------------------------------------------------------- */

static void on_sigchld(int sig) {
    (void)sig;
    int saved = errno;
    if (write(sigchld_pipe[1], "x", 1) < 0) { /* the pipe is full: a wake-up is pending */ }
    errno = saved;
}

static void on_term(int sig) {
    if (agent_pid > 0) kill(agent_pid, sig);
}

static int agent_status = -1; /* set when the Python agent has exited */
static pid_t command_pid = 0;
static int command_status = -1;

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == agent_pid) agent_status = status;
        else if (pid == command_pid) command_status = status;
    }
}

static void drain_wakeups(void) {
    char buf[64];
    while (read(sigchld_pipe[0], buf, sizeof buf) > 0) {}
}

static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

/* execvpe with the PATH of the command's own environment, as subprocess.Popen does. */
static void exec_in_path(char *const argv[], char *const envp[], const char *path) {
    const char *name = argv[0];
    if (strchr(name, '/')) {
        execve(name, argv, envp);
        return;
    }
    int first_error = 0;
    const char *p = path;
    char full[PATH_MAX];
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        int w = len ? snprintf(full, sizeof full, "%.*s/%s", (int)len, p, name)
                    : snprintf(full, sizeof full, "%s", name);
        if (w > 0 && (size_t)w < sizeof full) {
            execve(full, argv, envp);
            if (errno != ENOENT && errno != ENOTDIR && !first_error) first_error = errno;
        }
        if (!colon) break;
        p = colon + 1;
    }
    if (first_error) errno = first_error;
}

typedef struct {
    int conn;
    int host_alive;
    double last_send;
} Link;

static void host_gone(Link *l, pid_t pgid) {
    l->host_alive = 0;
    kill(-pgid, SIGKILL);
}

static void send_or_gone(Link *l, pid_t pgid, int type, const void *buf, size_t n) {
    if (!l->host_alive) return;
    if (send_frame(l->conn, type, buf, n)) host_gone(l, pgid);
    else l->last_send = now();
}

static void free_env(char **envp, int base_n) {
    for (int i = base_n; envp[i]; i++) free(envp[i]);
    free(envp);
}

/* Serves `r` on `conn`. Returns 0 when served, 1 when the command could not be started
 * (nothing was sent: the caller hands the request to the Python agent). */
static int serve_exec(int conn, Request *r, const char *workspace, int with_proxy) {
    char cwd[PATH_MAX];
    const char *c = r->cwd && *r->cwd ? r->cwd : workspace;
    if (c[0] == '/') snprintf(cwd, sizeof cwd, "%s", c);
    else if ((size_t)snprintf(cwd, sizeof cwd, "%s/%s", workspace, c) >= sizeof cwd) return 1;
    struct stat st;
    if (stat(cwd, &st) || !S_ISDIR(st.st_mode)) return 1; /* the agent says bad_cwd */

    /* The environment: the base, the proxy's, then the request's (later names win). */
    char **envp = calloc(3 + 6 + (size_t)r->envc + 1, sizeof *envp);
    if (!envp) return 1;
    int envn = 0;
    const char *path = NULL;
    const char *const *bases[2] = {BASE_ENV, PROXY_ENV};
    size_t counts[2] = {3, with_proxy ? 6 : 0};
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < counts[b]; i++) {
            const char *kv = bases[b][i];
            size_t klen = (size_t)(strchr(kv, '=') - kv);
            int overridden = 0;
            for (int e = 0; e < r->envc; e++)
                if (strlen(r->env_keys[e]) == klen && !memcmp(r->env_keys[e], kv, klen))
                    overridden = 1;
            if (!overridden) envp[envn++] = (char *)kv;
        }
    int base_n = envn; /* envp[base_n:] are this request's own, freed at the end */
    for (int e = 0; e < r->envc; e++) {
        size_t n = strlen(r->env_keys[e]) + strlen(r->env_vals[e]) + 2;
        char *kv = malloc(n);
        if (!kv) break;
        snprintf(kv, n, "%s=%s", r->env_keys[e], r->env_vals[e]);
        envp[envn++] = kv;
    }
    for (int i = 0; i < envn; i++)
        if (!strncmp(envp[i], "PATH=", 5)) path = envp[i] + 5;
    if (!path) path = "/bin:/usr/bin"; /* os.defpath */
    r->argv[r->argc] = NULL;

    int out[2], err[2], status_pipe[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(status_pipe, O_CLOEXEC))
        return 1;
    double started = now();
    pid_t pid = fork();
    if (pid < 0) { free_env(envp, base_n); return 1; }
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0 ||
            chdir(cwd)) {
            int e = errno;
            if (write(status_pipe[1], &e, sizeof e) < 0) {}
            _exit(127);
        }
        exec_in_path(r->argv, envp, path);
        int e = errno;
        if (write(status_pipe[1], &e, sizeof e) < 0) {}
        _exit(127);
    }
    command_pid = pid;
    command_status = -1;
    close(out[1]);
    close(err[1]);
    close(status_pipe[1]);
    int child_errno = 0;
    ssize_t got;
    do got = read(status_pipe[0], &child_errno, sizeof child_errno);
    while (got < 0 && errno == EINTR);
    close(status_pipe[0]);
    free_env(envp, base_n);
    if (got > 0) { /* not started: reap it and let the Python agent answer */
        while (command_status < 0) {
            int status;
            pid_t w = waitpid(pid, &status, 0);
            if (w == pid) command_status = status;
            else if (w < 0 && errno != EINTR) break;
        }
        close(out[0]);
        close(err[0]);
        command_pid = 0;
        return 1;
    }

    Link l = {conn, 1, started};
    int streams[2] = {out[0], err[0]};
    int timed_out = 0;
    double deadline = r->timeout >= 0 ? started + r->timeout : -1;
    double exited_at = -1;
    char *buf = malloc(OUTPUT_CHUNK);
    if (!buf) { kill(-pid, SIGKILL); }
    for (;;) {
        reap();
        if (command_status >= 0 && exited_at < 0) exited_at = now();
        int open_streams = (streams[0] >= 0) + (streams[1] >= 0);
        if (!open_streams && command_status >= 0) break;
        double t = now();
        double wait = 1e9; /* the nearest of: keepalive, timeout, end of the drain */
        if (r->heartbeat >= 0 && l.host_alive && l.last_send + r->heartbeat - t < wait)
            wait = l.last_send + r->heartbeat - t;
        if (deadline >= 0 && command_status < 0 && !timed_out && deadline - t < wait)
            wait = deadline - t;
        if (exited_at >= 0 && exited_at + DRAIN_GRACE - t < wait) wait = exited_at + DRAIN_GRACE - t;
        if (wait < 0) wait = 0;
        struct pollfd fds[6];
        int nfds = 0, at_out = -1, at_err = -1, at_conn = -1;
        if (streams[0] >= 0) { at_out = nfds; fds[nfds++] = (struct pollfd){streams[0], POLLIN, 0}; }
        if (streams[1] >= 0) { at_err = nfds; fds[nfds++] = (struct pollfd){streams[1], POLLIN, 0}; }
        if (l.host_alive) { at_conn = nfds; fds[nfds++] = (struct pollfd){conn, POLLIN, 0}; }
        int at_chld = nfds;
        fds[nfds++] = (struct pollfd){sigchld_pipe[0], POLLIN, 0};
        int at_wake = nfds;
        for (int w = 0; w < 2 && agent_go >= 0; w++)
            if (wake_fds[w] >= 0) fds[nfds++] = (struct pollfd){wake_fds[w], POLLIN, 0};
        int ms = wait >= 1e9 ? -1 : (int)(wait * 1000) + (wait > 0);
        int n = poll(fds, (nfds_t)nfds, ms);
        if (n < 0 && errno != EINTR) break;
        if (n > 0) {
            if (fds[at_chld].revents) drain_wakeups();
            for (int w = at_wake; w < nfds; w++)
                if (fds[w].revents) release_agent();
            int ats[2] = {at_out, at_err};
            for (int s = 0; s < 2; s++) {
                if (ats[s] < 0 || !fds[ats[s]].revents) continue;
                ssize_t k = buf ? read(streams[s], buf, OUTPUT_CHUNK) : 0;
                if (k < 0 && errno == EINTR) continue;
                if (k > 0) send_or_gone(&l, pid, s == 0 ? F_STDOUT : F_STDERR, buf, (size_t)k);
                else { close(streams[s]); streams[s] = -1; }
            }
            if (at_conn >= 0 && fds[at_conn].revents) {
                int type;
                char *payload;
                size_t len;
                if (recv_frame(conn, &type, &payload, &len)) host_gone(&l, pid);
                else {
                    Request k;
                    if (type == F_CONTROL && !parse_request(payload, len, &k)) {
                        if (k.is_kill) kill(-pid, SIGKILL);
                        free_request(&k);
                    }
                    free(payload); /* stdin frames: this command has none; ignored */
                }
            }
        }
        t = now();
        reap();
        if (deadline >= 0 && t >= deadline && command_status < 0 && !timed_out) {
            timed_out = 1;
            kill(-pid, SIGKILL);
        }
        if (command_status >= 0 && exited_at < 0) exited_at = t;
        if (command_status >= 0) release_agent();
        if (command_status >= 0 && (streams[0] >= 0 || streams[1] >= 0) &&
            t >= exited_at + DRAIN_GRACE)
            break; /* something outlived the command and holds its output open */
        if (r->heartbeat >= 0 && l.host_alive && t >= l.last_send + r->heartbeat)
            send_or_gone(&l, pid, F_CONTROL, "{\"keepalive\":true}", 18);
    }
    free(buf);
    for (int s = 0; s < 2; s++)
        if (streams[s] >= 0) close(streams[s]);
    while (command_status < 0) { /* only after an unexpected error: leave nothing running */
        kill(-pid, SIGKILL);
        int status;
        pid_t w = waitpid(pid, &status, 0);
        if (w == pid) command_status = status;
        else if (w < 0 && errno != EINTR) break;
    }
    command_pid = 0;
    if (!l.host_alive) return 0;
    char result[200];
    int ws_status = command_status;
    double duration = now() - started;
    if (WIFSIGNALED(ws_status))
        snprintf(result, sizeof result,
                 "{\"exit_code\":null,\"signal\":%d,\"timed_out\":%s,\"duration\":%.6f}",
                 WTERMSIG(ws_status), timed_out ? "true" : "false", duration);
    else
        snprintf(result, sizeof result,
                 "{\"exit_code\":%d,\"signal\":null,\"timed_out\":%s,\"duration\":%.6f}",
                 WEXITSTATUS(ws_status), timed_out ? "true" : "false", duration);
    send_control(conn, result);
    return 0;
}

/* After the last message, read until the host hangs up (see `agent._drain`). */
static void drain(int conn) {
    double until = now() + DRAIN_TIMEOUT;
    char buf[65536];
    for (;;) {
        double left = until - now();
        if (left <= 0) return;
        struct pollfd p = {conn, POLLIN, 0};
        int n = poll(&p, 1, (int)(left * 1000) + 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        ssize_t k = read(conn, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
    }
}

/* ---- handing a request to the Python agent ------------------------------------------- */

static void hand_off(int handoff, int conn, int type, const char *payload, size_t len) {
    unsigned char h[5] = {(unsigned char)(len >> 24), (unsigned char)(len >> 16),
                          (unsigned char)(len >> 8), (unsigned char)len, (unsigned char)type};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {h, 5};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &conn, sizeof(int));
    ssize_t w;
    do w = sendmsg(handoff, &msg, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != 5 || (len && write_all(handoff, payload, len)))
        logf_("could not hand a request to the agent: %s", strerror(errno));
}

/* ---- start-up ---------------------------------------------------------------------------- */

static int dial(const char *path, double retry_seconds) {
    struct sockaddr_un addr = {0};
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    double deadline = now() + retry_seconds, delay = 0.005;
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) return -1;
        if (!connect(s, (struct sockaddr *)&addr, sizeof addr)) return s;
        close(s);
        if (now() + delay > deadline) return -1;
        struct timespec ts = {(time_t)delay, (long)((delay - (time_t)delay) * 1e9)};
        nanosleep(&ts, NULL);
        delay = delay * 2 > 0.25 ? 0.25 : delay * 2;
    }
}

/* A connection with the agent's hello (its pid: one agent, whichever connection it is). */
static int dial_hello(const char *path, double retry_seconds, pid_t agent) {
    int conn = dial(path, retry_seconds);
    if (conn < 0) return -1;
    char hello[160];
    snprintf(hello, sizeof hello,
             "{\"hello\":\"aamp-guest\",\"protocol\":%d,\"version\":\"%s\",\"pid\":%d}",
             PROTOCOL_VERSION, AGENT_VERSION, (int)agent);
    if (send_control(conn, hello)) {
        close(conn);
        return -1;
    }
    return conn;
}

static int bind_forwarder(void) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(3128);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 128)) {
        close(s);
        return -1;
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        logf_("usage: agent-init AGENT --connect unix:/path [AGENT OPTIONS]");
        return 2;
    }
    char **agent_argv = argv + 1;
    const char *connect_to = NULL, *workspace = "/workspace";
    int egress = 0, plain = 0;
    double retry_seconds = 10.0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--connect") && has_value) connect_to = argv[++i];
        else if (!strcmp(a, "--egress") && has_value) { egress = 1; i++; }
        else if (!strcmp(a, "--workspace") && has_value) workspace = argv[++i];
        else if (!strcmp(a, "--hostname") && has_value) i++;
        else if (!strcmp(a, "--retry-seconds") && has_value) {
            char *end;
            retry_seconds = strtod(argv[++i], &end);
            if (*end || !isfinite(retry_seconds)) plain = 1;
        } else plain = 1; /* --init, --opt=value, anything new: the agent decides */
    }
    if (plain || !connect_to || strncmp(connect_to, "unix:/", 6)) {
        execv(agent_argv[0], agent_argv);
        logf_("cannot run the agent %s: %s", agent_argv[0], strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (pipe2(sigchld_pipe, O_CLOEXEC | O_NONBLOCK)) return 1;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sa.sa_handler = on_term;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    mkdir(workspace, 0777);
    char ws_real[PATH_MAX];
    if (!realpath(workspace, ws_real)) snprintf(ws_real, sizeof ws_real, "%s", workspace);
    int forwarder = egress ? bind_forwarder() : -1;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)) return 1;
    /* The Python agent: the same options, plus where its handed-off requests come from. */
    char **child_argv = calloc((size_t)argc + 6, sizeof *child_argv);
    if (!child_argv) return 1;
    int k = 0;
    for (int i = 1; i < argc; i++) child_argv[k++] = argv[i];
    char hfd[16], ffd[16];
    snprintf(hfd, sizeof hfd, "%d", HANDOFF_FD);
    snprintf(ffd, sizeof ffd, "%d", FORWARDER_FD);
    child_argv[k++] = "--handoff-fd";
    child_argv[k++] = hfd;
    if (forwarder >= 0) {
        child_argv[k++] = "--forwarder-fd";
        child_argv[k++] = ffd;
    }
    child_argv[k] = NULL;
    int go[2];
    if (pipe2(go, O_CLOEXEC)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(go[1]);
        char c;
        while (read(go[0], &c, 1) < 0 && errno == EINTR) {}
        signal(SIGPIPE, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        /* dup2 clears close-on-exec: exactly these two descriptors reach the agent */
        if (dup2(pair[1], HANDOFF_FD) < 0) _exit(1);
        if (forwarder >= 0 && dup2(forwarder, FORWARDER_FD) < 0) _exit(1);
        execv(child_argv[0], child_argv);
        logf_("cannot run the agent %s: %s", child_argv[0], strerror(errno));
        _exit(1);
    }
    agent_pid = pid;
    close(go[0]);
    agent_go = go[1];
    close(pair[1]);
    wake_fds[1] = forwarder; /* kept (never accepted on here) to see a first connection */

    int conn = dial_hello(connect_to + 5, retry_seconds, pid);


    /* The one request on this connection, whenever it comes (the host may give the first
     * request to the agent's own connection): orphans are reaped meanwhile. */
    while (conn >= 0 && agent_status < 0) {
        struct pollfd fds[2] = {{conn, POLLIN, 0}, {sigchld_pipe[0], POLLIN, 0}};
        int n = poll(fds, 2, agent_go >= 0 ? IDLE_START_MS : -1);
        if (n == 0) release_agent(); /* no request yet: let the agent start meanwhile */
        if (n < 0 && errno != EINTR) break;
        if (fds[1].revents) drain_wakeups();
        reap();
        if (n <= 0 || !fds[0].revents) continue;
        int type;
        char *payload;
        size_t len;
        int rc = recv_frame(conn, &type, &payload, &len);
        if (rc) break; /* the host closed it, or sent a bad frame: no answer, as the agent */
        /* As the agent does: a new spare first, so the host always has one (and knows the
         * guest is gone when it closes). It is the agent's to serve from. */
        int spare = dial_hello(connect_to + 5, 0, pid);
        if (spare >= 0) hand_off(pair[0], spare, HANDOFF_IDLE, NULL, 0);
        wake_fds[0] = spare; /* kept until the agent runs, to see a request come on it */
        Request r;
        int served = 0;
        if (type == F_CONTROL && !parse_request(payload, len, &r)) {
            if (r.is_exec && !serve_exec(conn, &r, ws_real, egress)) served = 1;
            free_request(&r);
        }
        release_agent(); /* whatever happened, the agent starts now */
        if (served) drain(conn);
        else hand_off(pair[0], conn, type, payload, len);
        free(payload);
        if (spare >= 0) close(spare);
        break;
    }
    release_agent();
    if (conn >= 0) close(conn);
    if (forwarder >= 0) close(forwarder);
    close(pair[0]); /* the agent's handoff reader sees the end */

    /* pid 1 from here on: reap, and leave with the agent. */
    while (agent_status < 0) {
        int status;
        pid_t w = waitpid(-1, &status, 0);
        if (w == agent_pid) agent_status = status;
        else if (w < 0 && errno == ECHILD) return 1;
    }
    return exit_code_of(agent_status);
}
