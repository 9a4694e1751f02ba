/*
 * rv2imm - RDMA WRITE with immediate / SEND with immediate over one RC QP,
 * the interop suite's peer for what perftest 4.5 cannot do. Built on the
 * host by test/interop (gcc ... -libverbs) and run in the VM against rxe0.
 *
 *   rv2imm [-d dev] [-g gid_index] [-o write|send] [-s size] [-n iters]
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
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define MSG_LEN 96
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
	int is_write = strcmp(op, "write") == 0;
	if ((!is_write && strcmp(op, "send")) || size <= 0 || iters <= 0 || iters > 4096) {
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
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
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
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
	if (ibv_modify_qp(qp, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify QP to INIT");

	struct peer me = {.qpn = qp->qp_num, .psn = lrand48() & 0xffffff, .rkey = mr->rkey, .vaddr = (uintptr_t)buf}, rem;
	if (ibv_query_gid(ctx, 1, gidx, &me.gid))
		die("query_gid");
	if (!server) {
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
	if (server) { /* requester */
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
