// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* Socket-level service load balancing for the node's own processes: a
 * connect (TCP, connected UDP) or unconnected UDP send to a service front
 * (VIP and port) is sent to a backend chosen from the front's
 * consistent-hash table instead, before any packet exists; getpeername and
 * recvmsg show the front again. No per-packet work and no conntrack: the
 * socket talks to the backend directly.
 *
 * A front without ready backends refuses at once: connect and send fail
 * with ECONNREFUSED.
 *
 * The programs are attached to the root of the cgroup v2 hierarchy, which
 * every socket of every network namespace passes; each loaded copy acts
 * only on the namespace named in its config (one node = one namespace).
 *
 * Rebuild the checked-in object with scripts/bpf (clang 14, -target bpf).
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"

#define ECONNREFUSED 111

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The config, when `ctx` is a socket of the node's namespace. */
static __always_inline struct lb_config *ours(void *ctx)
{
	struct lb_config *config_ = config();

	if (!config_ || !config_->netns_cookie ||
	    config_->netns_cookie != bpf_get_netns_cookie(ctx))
		return 0;
	return config_;
}

/* The loader's connect that tells the programs their namespace. */
static __always_inline int learn(struct bpf_sock_addr *ctx)
{
	struct lb_config *config_ = config();

	if (!config_ || !config_->learn[0] || ctx->user_ip6[0] != config_->learn[0] ||
	    ctx->user_ip6[1] != config_->learn[1] ||
	    ctx->user_ip6[2] != config_->learn[2] ||
	    ctx->user_ip6[3] != config_->learn[3])
		return 0;
	config_->learned = bpf_get_netns_cookie(ctx);
	return 1;
}

enum verdict { PASS, SENT, REFUSED };

/* Chooses the backend for a new socket (or datagram) to `key`. */
static __always_inline enum verdict choose(struct bpf_sock_addr *ctx,
					   struct lb_config *config,
					   struct front_key *key,
					   struct backend **chosen)
{
	struct front *front = bpf_map_lookup_elem(&cca_front_v1, key);
	enum lb_miss miss = LB_MISS_NONE;
	__u64 flow;

	if (!front)
		return PASS;
	if (front->count == 0) {
		count(LB_STAT_REJECTED);
		return REFUSED;
	}
	/* Host processes share the node's address: with affinity the node
	 * is the client, otherwise each socket is a flow of its own. */
	if (front->flags & LB_FRONT_AFFINITY)
		flow = config->netns_cookie;
	else
		flow = bpf_get_socket_cookie(ctx);
	*chosen = pick(front, mix(config->seed ^ mix(flow)), 0, &miss);
	if (!*chosen) {
		count(miss == LB_MISS_TABLE ? LB_STAT_NO_TABLE : LB_STAT_NO_BACKEND);
		return REFUSED;
	}
	count(LB_STAT_TRANSLATED);
	return SENT;
}

/* Remembers what the socket was sent to instead of `key`. */
static __always_inline void remember(struct bpf_sock_addr *ctx,
				     struct front_key *key,
				     struct backend *backend)
{
	struct sock_rev_key rev_key = {};
	struct sock_rev rev = {};

	rev_key.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rev_key.addr, backend->addr, sizeof(rev_key.addr));
	rev_key.port = backend->port;
	__builtin_memcpy(rev.addr, key->addr, sizeof(rev.addr));
	rev.port = key->port;
	bpf_map_update_elem(&cca_sockrev_v1, &rev_key, &rev, BPF_ANY);
}

static __always_inline int refuse(void)
{
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

static __always_inline void key4(struct bpf_sock_addr *ctx, struct front_key *key)
{
	key->addr[2] = bpf_htonl(0xffff);
	key->addr[3] = ctx->user_ip4;
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
}

static __always_inline void key6(struct bpf_sock_addr *ctx, struct front_key *key)
{
	key->addr[0] = ctx->user_ip6[0];
	key->addr[1] = ctx->user_ip6[1];
	key->addr[2] = ctx->user_ip6[2];
	key->addr[3] = ctx->user_ip6[3];
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
}

static __always_inline int send4(struct bpf_sock_addr *ctx)
{
	struct lb_config *config = ours(ctx);
	struct front_key key = {};
	struct backend *backend = 0;

	if (!config)
		return 1;
	key4(ctx, &key);
	switch (choose(ctx, config, &key, &backend)) {
	case REFUSED:
		return refuse();
	case SENT:
		if (!backend)
			return 1;
		/* An IPv4 socket can only be sent to an IPv4 backend. */
		if (backend->addr[0] || backend->addr[1] ||
		    backend->addr[2] != bpf_htonl(0xffff))
			return refuse();
		ctx->user_ip4 = backend->addr[3];
		ctx->user_port = backend->port;
		remember(ctx, &key, backend);
		return 1;
	default:
		return 1;
	}
}

static __always_inline int send6(struct bpf_sock_addr *ctx)
{
	struct lb_config *config = ours(ctx);
	struct front_key key = {};
	struct backend *backend = 0;

	if (!config)
		return 1;
	key6(ctx, &key);
	switch (choose(ctx, config, &key, &backend)) {
	case REFUSED:
		return refuse();
	case SENT:
		if (!backend)
			return 1;
		ctx->user_ip6[0] = backend->addr[0];
		ctx->user_ip6[1] = backend->addr[1];
		ctx->user_ip6[2] = backend->addr[2];
		ctx->user_ip6[3] = backend->addr[3];
		ctx->user_port = backend->port;
		remember(ctx, &key, backend);
		return 1;
	default:
		return 1;
	}
}

/* Shows the front instead of the backend a socket was sent to. */
static __always_inline struct sock_rev *reversed(struct bpf_sock_addr *ctx,
						 struct sock_rev_key *rev_key)
{
	struct sock_rev *rev;

	if (!ours(ctx))
		return 0;
	rev_key->cookie = bpf_get_socket_cookie(ctx);
	rev_key->port = (__u16)ctx->user_port;
	rev = bpf_map_lookup_elem(&cca_sockrev_v1, rev_key);
	if (rev)
		count(LB_STAT_REVERSED);
	return rev;
}

static __always_inline int reverse4(struct bpf_sock_addr *ctx)
{
	struct sock_rev_key rev_key = {};
	struct sock_rev *rev;

	rev_key.addr[2] = bpf_htonl(0xffff);
	rev_key.addr[3] = ctx->user_ip4;
	rev = reversed(ctx, &rev_key);
	if (rev) {
		ctx->user_ip4 = rev->addr[3];
		ctx->user_port = rev->port;
	}
	return 1;
}

static __always_inline int reverse6(struct bpf_sock_addr *ctx)
{
	struct sock_rev_key rev_key = {};
	struct sock_rev *rev;

	rev_key.addr[0] = ctx->user_ip6[0];
	rev_key.addr[1] = ctx->user_ip6[1];
	rev_key.addr[2] = ctx->user_ip6[2];
	rev_key.addr[3] = ctx->user_ip6[3];
	rev = reversed(ctx, &rev_key);
	if (rev) {
		ctx->user_ip6[0] = rev->addr[0];
		ctx->user_ip6[1] = rev->addr[1];
		ctx->user_ip6[2] = rev->addr[2];
		ctx->user_ip6[3] = rev->addr[3];
		ctx->user_port = rev->port;
	}
	return 1;
}

SEC("cgroup/connect4")
int cca_connect4(struct bpf_sock_addr *ctx)
{
	return send4(ctx);
}

SEC("cgroup/connect6")
int cca_connect6(struct bpf_sock_addr *ctx)
{
	if (learn(ctx))
		return 1;
	return send6(ctx);
}

SEC("cgroup/sendmsg4")
int cca_sendmsg4(struct bpf_sock_addr *ctx)
{
	return send4(ctx);
}

SEC("cgroup/sendmsg6")
int cca_sendmsg6(struct bpf_sock_addr *ctx)
{
	return send6(ctx);
}

SEC("cgroup/recvmsg4")
int cca_recvmsg4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/recvmsg6")
int cca_recvmsg6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}

SEC("cgroup/getpeername4")
int cca_getpeername4(struct bpf_sock_addr *ctx)
{
	return reverse4(ctx);
}

SEC("cgroup/getpeername6")
int cca_getpeername6(struct bpf_sock_addr *ctx)
{
	return reverse6(ctx);
}
