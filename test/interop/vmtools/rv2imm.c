/*
 * rv2imm - RDMA WRITE with immediate / SEND with immediate over one RC QP,
 * and memory windows (-o mw), the interop suite's peer for what perftest
 * 4.5 cannot do. Built on the host by test/interop (gcc ... -libverbs) and
 * run in the VM against rxe0.
 *
 *   rv2imm [-d dev] [-g gid_index] [-o write|send|mw] [-s size] [-n iters]
 *          [-p port] [-m mtu] [-t timeout] [server]
 *
 * The client is the requester: it posts iters WRITE_WITH_IMM (to slot i of
 * the server's buffer) or SEND_WITH_IMM work requests, message i filled with
 * byte k = (7*i + k) & 0xff and immediate 0x11220000 + i. The server is the
 * responder: it posts iters receives (slot i for SEND), checks every
 * completion (status, opcode, WITH_IMM flag, immediate, byte_len, order) and
 * every byte, and reports "ok" or "bad" to the client over TCP. Both exit 0
 * only when everything matched.
 *
 * Out-of-band (TCP, default port 18516): each side sends a 96-byte
 * NUL-padded "RV2IMM1 qpn psn rkey vaddr gid" (hex; gid = 32 hex digits in
 * byte order); the client first, the server after its QP is RTR/RTS; at the
 * end the server sends "ok\n" or "bad\n" (4 bytes, NUL-padded).
 *
 * -o mw: the server owns the windows, the client is the requester; -s is
 * the window length L (-n is not used). After the address exchange, each
 * step's 96-byte NUL-padded message on the same TCP connection:
 *   server: binds a type 1 window over [buf, buf+L) with ibv_bind_mw and a
 *           type 2 window over [buf+L, buf+2L) with an IBV_WR_BIND_MW work
 *           request (key byte + 1), both REMOTE_READ|REMOTE_WRITE, after
 *           filling them with pattern(1,k) and pattern(2,k); sends
 *           "RV2MW1 rkey1 va1 rkey2 va2 L"
 *   client: READs both windows (checks the patterns), WRITEs pattern(3,k)
 *           and pattern(4,k) through them; "RV2MW2 ok"
 *   server: checks its memory, IBV_WR_LOCAL_INV of rkey2, binds the type 2
 *           window again (key byte + 1 = rkey2b), posts a receive;
 *           "RV2MW3 rkey2b"
 *   client: WRITEs pattern(5,k) through rkey2b, then a SEND_WITH_INV of L
 *           bytes of pattern(6,k) invalidating rkey2b
 *   server: checks the receive (IBV_WC_WITH_INV, invalidated_rkey, byte_len,
 *           data) and the window's memory; "RV2MW5 ok"
 *   client: WRITEs 64 bytes of pattern(7,k) through rkey2b, which must complete with
 *           IBV_WC_REM_ACCESS_ERR (the responder's remote access NAK);
 *           "RV2MW6 ok"
 *   server: checks that the window still holds pattern(5,k) and that its QP
 *           went to the error state; sends the 4-byte verdict "ok"/"bad".
 * Any other message, status or byte makes both sides fail ("RV2MWn bad").
 * pattern(i,k) = (7*i + k) & 0xff, as the other modes'.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define MSG_LEN 96
#define MW_REFUSED_LEN 64 /* -o mw: the WRITE after the invalidate */
#define IMM_BASE 0x11220000u

struct peer {
	uint32_t qpn, psn, rkey;
	uint64_t vaddr;
	union ibv_gid gid;
};

static void die(const char *what)
{
	fprintf(stderr, "rv2imm: %s: %s\n", what, errno ? strerror(errno) : "failed");
	exit(2);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int full_io(int fd, void *buf, size_t n, int wr)
{
	size_t off = 0;
	while (off < n) {
		ssize_t k = wr ? write(fd, (char *)buf + off, n - off) : read(fd, (char *)buf + off, n - off);
		if (k <= 0)
			return -1;
		off += k;
	}
	return 0;
}

static void encode(char *msg, const struct peer *p)
{
	char gid[33];
	for (int i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", p->gid.raw[i]);
	memset(msg, 0, MSG_LEN);
	snprintf(msg, MSG_LEN, "RV2IMM1 %06x %06x %08x %016" PRIx64 " %s", p->qpn, p->psn, p->rkey, p->vaddr, gid);
}

static int decode(const char *msg, struct peer *p)
{
	char gid[33];
	if (sscanf(msg, "RV2IMM1 %x %x %x %" SCNx64 " %32s", &p->qpn, &p->psn, &p->rkey, &p->vaddr, gid) != 5 ||
	    strlen(gid) != 32)
		return -1;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(gid + 2 * i, "%2x", &v) != 1)
			return -1;
		p->gid.raw[i] = v;
	}
	return 0;
}

static int oob_connect(const char *server, int port)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	if (getaddrinfo(server, ps, &hints, &res))
		die("getaddrinfo");
	int fd = socket(res->ai_family, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen))
		die("connect");
	freeaddrinfo(res);
	return fd;
}

static int oob_accept(int port)
{
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any};
	int one = 1, ls = socket(AF_INET6, SOCK_STREAM, 0);
	if (ls < 0)
		die("socket");
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1))
		die("bind/listen");
	int fd = accept(ls, NULL, NULL);
	if (fd < 0)
		die("accept");
	close(ls);
	return fd;
}

static void to_rts(struct ibv_qp *qp, const struct peer *me, const struct peer *rem, int gidx,
		   enum ibv_mtu mtu, int timeout)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = rem->qpn,
		.rq_psn = rem->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.port_num = 1,
			.grh = {.dgid = rem->gid, .sgid_index = gidx, .hop_limit = 64},
		},
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify QP to RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = me->psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify QP to RTS");
}

static unsigned char pattern(long i, long k) { return (7 * i + k) & 0xff; }

/* ---- -o mw ---- */

struct mwctx {
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned char *buf;
	long len;
	int fd;
	double deadline;
	int bad;
};

static void fill(unsigned char *b, long n, long i)
{
	for (long k = 0; k < n; k++)
		b[k] = pattern(i, k);
}

/* check reports (once) the first byte of b that is not pattern(i, .). */
static int check(struct mwctx *c, const char *what, const unsigned char *b, long i)
{
	for (long k = 0; k < c->len; k++)
		if (b[k] != pattern(i, k)) {
			fprintf(stderr, "rv2imm: %s: byte %ld is %#x, want %#x (pattern %ld)\n", what, k, b[k], pattern(i, k), i);
			c->bad = 1;
			return -1;
		}
	return 0;
}

/* next_wc waits for one completion (60 s in all). */
static int next_wc(struct mwctx *c, struct ibv_wc *wc)
{
	for (;;) {
		int n = ibv_poll_cq(c->cq, 1, wc);
		if (n < 0)
			die("poll_cq");
		if (n == 1)
			return 0;
		if (now() > c->deadline) {
			fprintf(stderr, "rv2imm: timeout waiting for a completion\n");
			exit(1);
		}
	}
}

/* expect_wc waits for a successful completion of wr_id with opcode op. */
static void expect_wc(struct mwctx *c, const char *what, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	next_wc(c, &wc);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id || wc.opcode != op) {
		fprintf(stderr, "rv2imm: %s: wr_id %" PRIu64 " (want %" PRIu64 ") status %s opcode %d (want %d)\n",
			what, wc.wr_id, wr_id, ibv_wc_status_str(wc.status), wc.opcode, op);
		exit(1);
	}
}

static void mw_send(struct mwctx *c, const char *fmt, ...)
{
	char msg[MSG_LEN] = {0};
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (full_io(c->fd, msg, MSG_LEN, 1))
		die("out-of-band write");
}

/* mw_recv reads the next step message, which must start with tag and not
 * say "bad". */
static void mw_recv(struct mwctx *c, const char *tag, char *msg)
{
	if (full_io(c->fd, msg, MSG_LEN, 0))
		die("out-of-band read");
	msg[MSG_LEN - 1] = 0;
	if (strncmp(msg, tag, strlen(tag)) || strstr(msg, "bad")) {
		fprintf(stderr, "rv2imm: peer says %.*s (want %s ...)\n", MSG_LEN, msg, tag);
		exit(1);
	}
}

static void post(struct mwctx *c, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *badwr;
	if (ibv_post_send(c->qp, wr, &badwr))
		die(what);
}

/* rdma posts a signalled READ or WRITE of n bytes at buf + slot*L. */
static void rdma(struct mwctx *c, uint64_t id, enum ibv_wr_opcode op, int slot, long n, uint32_t rkey, uint64_t va)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(c->buf + slot * c->len), .length = n, .lkey = c->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = va;
	wr.wr.rdma.rkey = rkey;
	post(c, &wr, "post RDMA");
}

/* bind2 binds the type 2 window mw over [buf+L, buf+2L) with a bind work
 * request, key byte + 1, and returns the new rkey. */
static uint32_t bind2(struct mwctx *c, struct ibv_mw *mw, uint64_t id)
{
	struct ibv_send_wr wr = {.wr_id = id, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){.mr = c->mr, .addr = (uintptr_t)(c->buf + c->len),
		.length = c->len, .mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
	post(c, &wr, "post BIND_MW");
	expect_wc(c, "type 2 bind (IBV_WR_BIND_MW)", id, IBV_WC_BIND_MW);
	/* The provider leaves mw->rkey alone for a bind work request; the
	 * next bind or invalidate names the window by its current rkey. */
	mw->rkey = wr.bind_mw.rkey;
	return mw->rkey;
}

/* mw_owner is the server of -o mw: it owns the windows. */
static int mw_owner(struct mwctx *c)
{
	char msg[MSG_LEN];
	unsigned char *w1 = c->buf, *w2 = c->buf + c->len, *rx = c->buf + 2 * c->len;
	fill(w1, c->len, 1);
	fill(w2, c->len, 2);
	struct ibv_mw *mw1 = ibv_alloc_mw(c->pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
	if (!mw1 || !mw2)
		die("ibv_alloc_mw");
	struct ibv_mw_bind b1 = {.wr_id = 101, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = {.mr = c->mr, .addr = (uintptr_t)w1, .length = c->len,
			      .mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE}};
	if (ibv_bind_mw(c->qp, mw1, &b1))
		die("ibv_bind_mw");
	expect_wc(c, "type 1 bind (ibv_bind_mw)", 101, IBV_WC_BIND_MW);
	uint32_t rkey1 = mw1->rkey, rkey2 = bind2(c, mw2, 102);
	printf("windows: type 1 rkey 0x%08x va 0x%016" PRIx64 ", type 2 rkey 0x%08x va 0x%016" PRIx64 ", length %ld\n",
	       rkey1, (uint64_t)(uintptr_t)w1, rkey2, (uint64_t)(uintptr_t)w2, c->len);
	mw_send(c, "RV2MW1 %08x %016" PRIx64 " %08x %016" PRIx64 " %lx", rkey1, (uint64_t)(uintptr_t)w1, rkey2,
		(uint64_t)(uintptr_t)w2, c->len);

	mw_recv(c, "RV2MW2 ok", msg);
	check(c, "type 1 window after the peer's WRITE", w1, 3);
	check(c, "type 2 window after the peer's WRITE", w2, 4);
	struct ibv_send_wr inv = {.wr_id = 103, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED};
	inv.invalidate_rkey = rkey2;
	post(c, &inv, "post LOCAL_INV");
	expect_wc(c, "local invalidate (IBV_WR_LOCAL_INV)", 103, IBV_WC_LOCAL_INV);
	/* A type 2 window binds only when invalid: the rebind proves it. */
	uint32_t rkey2b = bind2(c, mw2, 104);
	struct ibv_sge sge = {.addr = (uintptr_t)rx, .length = c->len, .lkey = c->mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 201, .sg_list = &sge, .num_sge = 1}, *badr;
	if (ibv_post_recv(c->qp, &rwr, &badr))
		die("post_recv");
	printf("type 2 window invalidated locally and bound again: rkey 0x%08x\n", rkey2b);
	mw_send(c, "RV2MW3 %08x%s", rkey2b, c->bad ? " bad" : "");

	struct ibv_wc wc;
	next_wc(c, &wc);
	/* rxe writes the kernel's wc_flags into the user CQE: its
	 * IB_WC_WITH_INVALIDATE is bit 2, which libibverbs calls
	 * IBV_WC_IP_CSUM_OK (IBV_WC_WITH_INV is bit 3). Either says "with
	 * invalidate" here: no IP checksum offload is involved on RC. */
	int with_inv = wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 201 || wc.opcode != IBV_WC_RECV || !with_inv ||
	    wc.invalidated_rkey != rkey2b || wc.byte_len != (uint32_t)c->len) {
		fprintf(stderr, "rv2imm: SEND_WITH_INV receive: status %s wr_id %" PRIu64 " opcode %d flags %#x invalidated_rkey %#x (want %#x) byte_len %u (want %ld)\n",
			ibv_wc_status_str(wc.status), wc.wr_id, wc.opcode, wc.wc_flags, wc.invalidated_rkey, rkey2b, wc.byte_len, c->len);
		c->bad = 1;
	}
	check(c, "SEND_WITH_INV data", rx, 6);
	check(c, "type 2 window after the WRITE through its new rkey", w2, 5);
	printf("SEND_WITH_INV received: invalidated rkey 0x%08x, wc_flags %#x\n", wc.invalidated_rkey, wc.wc_flags);
	mw_send(c, "RV2MW5 %s", c->bad ? "bad" : "ok");

	mw_recv(c, "RV2MW6 ok", msg);
	check(c, "type 2 window after the refused WRITE", w2, 5);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	if (ibv_query_qp(c->qp, &qa, IBV_QP_STATE, &qia))
		die("query_qp");
	if (qa.qp_state != IBV_QPS_ERR) {
		fprintf(stderr, "rv2imm: QP state %d after the remote access error, want IBV_QPS_ERR\n", qa.qp_state);
		c->bad = 1;
	}
	char res[4] = {0};
	strcpy(res, c->bad ? "bad" : "ok");
	full_io(c->fd, res, sizeof res, 1);
	printf("memory windows (responder, rkeys 0x%08x 0x%08x 0x%08x): bind type 1, bind type 2, LOCAL_INV, rebind, SEND_WITH_INV, remote access error: %s\n",
	       rkey1, rkey2, rkey2b, c->bad ? "MISMATCH" : "ok");
	ibv_dealloc_mw(mw1);
	ibv_dealloc_mw(mw2);
	return c->bad;
}

/* mw_user is the client of -o mw: the requester, through the windows. */
static int mw_user(struct mwctx *c)
{
	char msg[MSG_LEN];
	uint32_t rkey1, rkey2, rkey2b;
	uint64_t va1, va2;
	long len;
	mw_recv(c, "RV2MW1 ", msg);
	if (sscanf(msg, "RV2MW1 %x %" SCNx64 " %x %" SCNx64 " %lx", &rkey1, &va1, &rkey2, &va2, &len) != 5 || len != c->len) {
		fprintf(stderr, "rv2imm: bad window message %.*s (want length %lx)\n", MSG_LEN, msg, c->len);
		return 1;
	}
	printf("windows: type 1 rkey 0x%08x va 0x%016" PRIx64 ", type 2 rkey 0x%08x va 0x%016" PRIx64 ", length %ld\n",
	       rkey1, va1, rkey2, va2, len);
	/* Slots of L bytes: 0, 1 READ targets; 2..6 sources of patterns 3..7. */
	for (int i = 3; i <= 7; i++)
		fill(c->buf + (i - 1) * c->len, c->len, i);
	rdma(c, 1, IBV_WR_RDMA_READ, 0, c->len, rkey1, va1);
	rdma(c, 2, IBV_WR_RDMA_READ, 1, c->len, rkey2, va2);
	rdma(c, 3, IBV_WR_RDMA_WRITE, 2, c->len, rkey1, va1);
	rdma(c, 4, IBV_WR_RDMA_WRITE, 3, c->len, rkey2, va2);
	expect_wc(c, "READ through the type 1 window", 1, IBV_WC_RDMA_READ);
	expect_wc(c, "READ through the type 2 window", 2, IBV_WC_RDMA_READ);
	expect_wc(c, "WRITE through the type 1 window", 3, IBV_WC_RDMA_WRITE);
	expect_wc(c, "WRITE through the type 2 window", 4, IBV_WC_RDMA_WRITE);
	check(c, "READ through the type 1 window", c->buf, 1);
	check(c, "READ through the type 2 window", c->buf + c->len, 2);
	mw_send(c, "RV2MW2 %s", c->bad ? "bad" : "ok");

	mw_recv(c, "RV2MW3 ", msg);
	if (sscanf(msg, "RV2MW3 %x", &rkey2b) != 1)
		die("RV2MW3 message");
	rdma(c, 5, IBV_WR_RDMA_WRITE, 4, c->len, rkey2b, va2);
	struct ibv_sge sge = {.addr = (uintptr_t)(c->buf + 5 * c->len), .length = c->len, .lkey = c->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 6, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.invalidate_rkey = rkey2b;
	post(c, &wr, "post SEND_WITH_INV");
	expect_wc(c, "WRITE through the rebound type 2 window", 5, IBV_WC_RDMA_WRITE);
	expect_wc(c, "SEND_WITH_INV", 6, IBV_WC_SEND);
	mw_recv(c, "RV2MW5 ok", msg);

	/* One packet: rxe drops the packets that follow the refused one
	 * without counting them (its responder is in ERR by then). */
	rdma(c, 7, IBV_WR_RDMA_WRITE, 6, c->len < MW_REFUSED_LEN ? c->len : MW_REFUSED_LEN, rkey2b, va2);
	struct ibv_wc wc;
	next_wc(c, &wc);
	int refused = wc.wr_id == 7 && wc.status == IBV_WC_REM_ACCESS_ERR;
	printf("WRITE through the invalidated rkey 0x%08x: %s\n", rkey2b, ibv_wc_status_str(wc.status));
	if (!refused) {
		fprintf(stderr, "rv2imm: WRITE after the invalidate: wr_id %" PRIu64 " status %s, want 7 and %s\n",
			wc.wr_id, ibv_wc_status_str(wc.status), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
		c->bad = 1;
	}
	mw_send(c, "RV2MW6 %s", c->bad ? "bad" : "ok");
	char res[5] = {0};
	if (full_io(c->fd, res, 4, 0))
		die("reading the server's verdict");
	res[strcspn(res, "\n")] = 0;
	if (strncmp(res, "ok", 2))
		c->bad = 1;
	printf("memory windows (requester, rkeys 0x%08x 0x%08x 0x%08x): READ+WRITE type 1, READ+WRITE type 2, WRITE after rebind, SEND_WITH_INV, WRITE refused (%s); server says %s: %s\n",
	       rkey1, rkey2, rkey2b, ibv_wc_status_str(wc.status), res, c->bad ? "MISMATCH" : "ok");
	return c->bad;
}

int main(int argc, char **argv)
{
	const char *devname = NULL, *op = "write";
	int gidx = 1, port = 18516, timeout = 14, c;
	long size = 4096, iters = 50;
	enum ibv_mtu mtu = IBV_MTU_1024;
	while ((c = getopt(argc, argv, "d:g:o:s:n:p:m:t:")) != -1) {
		switch (c) {
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'o': op = optarg; break;
		case 's': size = atol(optarg); break;
		case 'n': iters = atol(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 't': timeout = atoi(optarg); break;
		case 'm':
			switch (atoi(optarg)) {
			case 256: mtu = IBV_MTU_256; break;
			case 512: mtu = IBV_MTU_512; break;
			case 1024: mtu = IBV_MTU_1024; break;
			case 2048: mtu = IBV_MTU_2048; break;
			case 4096: mtu = IBV_MTU_4096; break;
			default: fprintf(stderr, "rv2imm: bad -m\n"); return 2;
			}
			break;
		default:
			fprintf(stderr, "usage: rv2imm [-d dev] [-g gidx] [-o write|send] [-s size] [-n iters] [-p port] [-m mtu] [-t timeout] [server]\n");
			return 2;
		}
	}
	int is_write = strcmp(op, "write") == 0, is_mw = strcmp(op, "mw") == 0;
	if (is_mw)
		iters = 7; /* buffer slots of -s bytes (mw_user uses 7) */
	if ((!is_write && !is_mw && strcmp(op, "send")) || size <= 0 || iters <= 0 || iters > 4096) {
		fprintf(stderr, "rv2imm: bad -o, -s or -n\n");
		return 2;
	}
	const char *server = optind < argc ? argv[optind] : NULL;
	srand48(getpid() * time(NULL));

	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			dev = list[i];
	if (!dev)
		die("no such RDMA device");
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	size_t total = (size_t)size * iters;
	unsigned char *buf = aligned_alloc(4096, (total + 4095) & ~(size_t)4095);
	if (!pd || !buf)
		die("alloc");
	memset(buf, 0, total);
	int mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	if (is_mw)
		mr_access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, total, mr_access);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * iters + 4, NULL, NULL, 0);
	if (!mr || !cq)
		die("reg_mr/create_cq");
	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = iters, .max_recv_wr = iters, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	if (!qp)
		die("create_qp");
	struct ibv_qp_attr ia = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | (is_mw ? IBV_ACCESS_REMOTE_READ : 0)};
	if (ibv_modify_qp(qp, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify QP to INIT");

	struct peer me = {.qpn = qp->qp_num, .psn = lrand48() & 0xffffff, .rkey = mr->rkey, .vaddr = (uintptr_t)buf}, rem;
	if (ibv_query_gid(ctx, 1, gidx, &me.gid))
		die("query_gid");
	if (!server && !is_mw) {
		for (long i = 0; i < iters; i++) {
			struct ibv_sge sge = {.addr = (uintptr_t)(buf + i * size), .length = size, .lkey = mr->lkey};
			struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
			if (ibv_post_recv(qp, &wr, &bad))
				die("post_recv");
		}
	}
	char msg[MSG_LEN];
	int fd;
	if (server) {
		fd = oob_connect(server, port);
		encode(msg, &me);
		if (full_io(fd, msg, MSG_LEN, 1) || full_io(fd, msg, MSG_LEN, 0) || decode(msg, &rem))
			die("out-of-band exchange");
		to_rts(qp, &me, &rem, gidx, mtu, timeout);
	} else {
		fd = oob_accept(port);
		if (full_io(fd, msg, MSG_LEN, 0) || decode(msg, &rem))
			die("out-of-band exchange");
		to_rts(qp, &me, &rem, gidx, mtu, timeout);
		encode(msg, &me);
		if (full_io(fd, msg, MSG_LEN, 1))
			die("out-of-band reply");
	}
	printf("local  QPN 0x%06x PSN 0x%06x RKey 0x%08x VAddr 0x%016" PRIx64 "\n", me.qpn, me.psn, me.rkey, me.vaddr);
	printf("remote QPN 0x%06x PSN 0x%06x RKey 0x%08x VAddr 0x%016" PRIx64 "\n", rem.qpn, rem.psn, rem.rkey, rem.vaddr);

	double t0 = now(), deadline = t0 + 60;
	int bad = 0;
	if (is_mw) {
		struct mwctx mc = {.pd = pd, .mr = mr, .cq = cq, .qp = qp, .buf = buf, .len = size, .fd = fd, .deadline = deadline};
		bad = server ? mw_user(&mc) : mw_owner(&mc);
	} else if (server) { /* requester */
		for (long i = 0; i < iters; i++) {
			for (long k = 0; k < size; k++)
				buf[i * size + k] = pattern(i, k);
			struct ibv_sge sge = {.addr = (uintptr_t)(buf + i * size), .length = size, .lkey = mr->lkey};
			struct ibv_send_wr wr = {
				.wr_id = i, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED,
				.opcode = is_write ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_SEND_WITH_IMM,
				.imm_data = htonl(IMM_BASE + i),
			}, *badwr;
			if (is_write) {
				wr.wr.rdma.remote_addr = rem.vaddr + i * size;
				wr.wr.rdma.rkey = rem.rkey;
			}
			if (ibv_post_send(qp, &wr, &badwr))
				die("post_send");
		}
		for (long done = 0; done < iters;) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0)
				die("poll_cq");
			if (n == 0) {
				if (now() > deadline) {
					fprintf(stderr, "rv2imm: timeout after %ld of %ld completions\n", done, iters);
					return 1;
				}
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "rv2imm: wr %" PRIu64 ": %s\n", wc.wr_id, ibv_wc_status_str(wc.status));
				return 1;
			}
			done++;
		}
		char res[4] = {0};
		if (full_io(fd, res, sizeof res, 0))
			die("reading the server's verdict");
		bad = strncmp(res, "ok", 2) != 0;
		printf("%ld %s of %ld bytes: server says %.3s\n", iters, is_write ? "RDMA_WRITE_WITH_IMM" : "SEND_WITH_IMM", size, res);
	} else { /* responder */
		for (long done = 0; done < iters;) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0)
				die("poll_cq");
			if (n == 0) {
				if (now() > deadline) {
					fprintf(stderr, "rv2imm: timeout after %ld of %ld completions\n", done, iters);
					return 1;
				}
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "rv2imm: recv %" PRIu64 ": %s\n", wc.wr_id, ibv_wc_status_str(wc.status));
				return 1;
			}
			enum ibv_wc_opcode want = is_write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
			uint32_t imm = ntohl(wc.imm_data);
			if (wc.opcode != want || !(wc.wc_flags & IBV_WC_WITH_IMM) || imm != IMM_BASE + done ||
			    wc.byte_len != (uint32_t)size || (long)wc.wr_id != done) {
				fprintf(stderr, "rv2imm: completion %ld: opcode %d (want %d) flags %#x imm %#x (want %#x) byte_len %u (want %ld) wr_id %" PRIu64 "\n",
					done, wc.opcode, want, wc.wc_flags, imm, IMM_BASE + (uint32_t)done, wc.byte_len, size, wc.wr_id);
				bad = 1;
			}
			done++;
		}
		long wrong = 0;
		for (long i = 0; i < iters; i++)
			for (long k = 0; k < size; k++)
				if (buf[i * size + k] != pattern(i, k)) {
					if (!wrong)
						fprintf(stderr, "rv2imm: message %ld byte %ld: %#x, want %#x\n", i, k, buf[i * size + k], pattern(i, k));
					wrong++;
				}
		if (wrong) {
			fprintf(stderr, "rv2imm: %ld wrong bytes\n", wrong);
			bad = 1;
		}
		char res[4] = {0};
		strcpy(res, bad ? "bad" : "ok");
		full_io(fd, res, sizeof res, 1);
		printf("%ld %s of %ld bytes received and verified: %s\n", iters, is_write ? "RDMA_WRITE_WITH_IMM" : "SEND_WITH_IMM", size, bad ? "MISMATCH" : "ok");
	}
	printf("%.3f seconds\n", now() - t0);
	close(fd);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return bad;
}
