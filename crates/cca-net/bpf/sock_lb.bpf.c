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

#include "lb.h"

#define ECONNREFUSED 111

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_cfg_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_FRONTS);
	/* Allocated as used: a node pays for the VIP ports it has. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct front_key);
	__type(value, struct front);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_front_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* Two generations of each front's table. */
	__uint(max_entries, 2 * LB_MAX_FRONTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct table_key);
	__type(value, struct table);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_table_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * LB_MAX_FRONTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct table_key);
	__type(value, struct small_table);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_tsmall_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* One per backend address and port: a service's ports each have
	 * their own (10,000 services of two ports over three backends are
	 * 60,000); allocated as used. */
	__uint(max_entries, LB_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_backend_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_SOCK_REV);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_sockrev_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_stats_v1 SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *value = bpf_map_lookup_elem(&cca_stats_v1, &stat);

	if (value)
		*value += 1;
}

/* The same mixing as cca_net::ebpf::hash (a 64-bit finaliser): every node
 * computes the same slot for the same flow and seed. */
static __always_inline __u64 mix(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

static __always_inline struct lb_config *config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cca_cfg_v1, &zero);
}

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
	struct table_key table_key = {};
	__u64 flow;
	__u64 hash;
	__u32 slot;
	__u32 id;

	if (!front)
		return PASS;
	if (front->count == 0) {
		count(LB_STAT_REJECTED);
		return REFUSED;
	}
	table_key.front = front->id;
	table_key.gen = front->gen;
	/* Host processes share the node's address: with affinity the node
	 * is the client, otherwise each socket is a flow of its own. */
	if (front->flags & LB_FRONT_AFFINITY)
		flow = config->netns_cookie;
	else
		flow = bpf_get_socket_cookie(ctx);
	hash = mix(config->seed ^ mix(flow));
	if (front->flags & LB_FRONT_SMALL) {
		struct small_table *table =
			bpf_map_lookup_elem(&cca_tsmall_v1, &table_key);

		if (!table) {
			count(LB_STAT_NO_TABLE);
			return REFUSED;
		}
		slot = hash % LB_SMALL_TABLE_SIZE;
		/* The verifier does not bound a remainder: hide the value
		 * from the compiler so the check stays for the verifier. */
		asm volatile("" : "+r"(slot));
		if (slot >= LB_SMALL_TABLE_SIZE)
			return PASS;
		id = table->backend[slot];
	} else {
		struct table *table =
			bpf_map_lookup_elem(&cca_table_v1, &table_key);

		if (!table) {
			count(LB_STAT_NO_TABLE);
			return REFUSED;
		}
		slot = hash % LB_TABLE_SIZE;
		asm volatile("" : "+r"(slot));
		if (slot >= LB_TABLE_SIZE)
			return PASS;
		id = table->backend[slot];
	}
	*chosen = bpf_map_lookup_elem(&cca_backend_v1, &id);
	if (!*chosen) {
		count(LB_STAT_NO_BACKEND);
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
