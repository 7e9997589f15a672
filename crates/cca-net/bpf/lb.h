/* The eBPF service load balancer's map layout, shared by the programs and
 * (mirrored field by field) by cca_net::ebpf::layout in Rust, which checks
 * sizes and offsets in its tests.
 *
 * Layout version 1. A change to any struct or map here bumps LB_LAYOUT and
 * the _v1 suffix of every map name: the loader then creates the new maps
 * beside the old pinned ones and live flows keep their maps until the new
 * programs are attached.
 *
 * Addresses are 16 bytes, IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d), so one
 * key serves both families and a dual-stack socket connecting to a mapped
 * address finds the IPv4 front. Addresses and ports are in network order.
 */
#ifndef CCA_LB_H
#define CCA_LB_H

#include <linux/types.h>

#define LB_LAYOUT 1
/* Slots of a front's consistent-hash (Maglev) table: prime, and large
 * against the backends of one front. A front with up to LB_SMALL_MAX
 * backends has a small table (shares even within ~3%), a larger one a
 * large table (within ~1% at 10 backends, ~10% at 100): most services
 * have few backends, and the tables are most of the maps' memory. */
#define LB_TABLE_SIZE 1021
#define LB_SMALL_TABLE_SIZE 251
#define LB_SMALL_MAX 8
#define LB_MAX_FRONTS 65536
#define LB_MAX_BACKENDS 262144
#define LB_MAX_SOCK_REV 65536
/* Entries of the containers' flow table: two a flow, so 32,768 flows
 * through VIPs at once a node before the least recently used go. */
#define LB_MAX_CT 65536

/* front.flags */
#define LB_FRONT_AFFINITY 1 /* the same client goes to the same backend */
#define LB_FRONT_SMALL 2    /* its table is in the small-table map */

/* stats indexes */
enum lb_stat {
	LB_STAT_TRANSLATED = 0, /* connects and datagrams sent to a backend */
	LB_STAT_REJECTED = 1,   /* refused: the front has no ready backend */
	LB_STAT_NO_TABLE = 2,   /* a front without its table (refused) */
	LB_STAT_NO_BACKEND = 3, /* a table slot without its backend (refused) */
	LB_STAT_REVERSED = 4,   /* peer addresses shown as the front again */
	LB_STAT_COUNT = 5,
};

/* tc stats indexes (cca_tcstats_v1): what the programs on instances'
 * veths did. */
enum lb_tc_stat {
	LB_TC_FLOWS = 0,       /* new flows sent to a backend */
	LB_TC_HAIRPIN = 1,     /* of those, sent back to their own source */
	LB_TC_RESET = 2,       /* TCP resets sent for a front without backends */
	LB_TC_UNREACHABLE = 3, /* ICMP port-unreachable sent for UDP */
	LB_TC_LIMITED = 4,     /* refused packets dropped over the budget */
	LB_TC_RESELECTED = 5,  /* flows whose backend went, balanced again */
	LB_TC_NO_TABLE = 6,    /* a front without its table (dropped) */
	LB_TC_NO_BACKEND = 7,  /* a slot without its backend (dropped) */
	LB_TC_PASSED = 8,      /* to a front, not handled (IP options,
				* fragments): left to the kernel's rules */
	LB_TC_STAT_COUNT = 9,
};

/* Refusals answered a second per CPU, and how many may come at once
 * (a token bucket: REJECT_RATE tokens a second, REJECT_BURST at most). */
#define LB_REJECT_RATE 100
#define LB_REJECT_BURST 25

struct lb_config {
	/* Only sockets of this network namespace are balanced: cgroup hooks
	 * see every namespace's sockets. */
	__u64 netns_cookie;
	/* The cluster-wide flow-hash seed (also the Maglev tables'). */
	__u64 seed;
	__u32 layout;
	__u32 pad;
	/* A connect to this address (a random address in 2001:db8::/32,
	 * never routed; zero: none) comes from the loader, in the node's
	 * namespace: the programs write that namespace's cookie to `learned`,
	 * and the loader copies it to netns_cookie. */
	__u32 learn[4];
	__u64 learned;
};

struct front_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

struct front {
	__u32 id;
	/* Ready backends in the table of generation `gen`; 0: refuse. */
	__u16 count;
	/* Which of the front's two tables is live: a new table is written
	 * under the other generation, then this value is replaced whole. */
	__u8 gen;
	__u8 flags;
};

struct table_key {
	__u32 front;
	__u32 gen;
};

struct table {
	__u32 backend[LB_TABLE_SIZE]; /* backend ids */
};

struct small_table {
	__u32 backend[LB_SMALL_TABLE_SIZE];
};

struct backend {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

/* What a socket was sent to instead of the front, to show the front again
 * to getpeername and recvmsg. */
struct sock_rev_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2;
};

struct sock_rev {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

/* A flow as the tc programs see a packet: to the front (dir
 * LB_CT_FORWARD: the client's address and port, the front's) or back
 * from a backend (LB_CT_REVERSE: the backend's, the client's). */
struct ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 dir;
	__u16 pad;
};

#define LB_CT_FORWARD 0
#define LB_CT_REVERSE 1

/* ct_entry.flags */
#define LB_CT_HAIRPIN 1 /* the client is its own backend */
#define LB_CT_CLOSING 2 /* a FIN or RST was seen */

struct ct_entry {
	/* Forward: the backend the flow goes to; reverse: the front it
	 * came to. */
	__u32 addr[4];
	__u16 port;
	__u8 flags;
	__u8 pad;
	/* The backend's id: a forward entry whose backend is gone (or
	 * whose id now names another address) is balanced again. */
	__u32 backend;
	/* bpf_ktime_get_ns of the last packet, to a second. */
	__u64 seen;
};

/* The service ranges (IPv4 as mapped): only packets to an address in one
 * are looked up as flows to a front. An all-zero range holds every
 * address. */
struct lb_range {
	__u32 net[4];
	__u32 mask[4];
};

struct tc_config {
	struct lb_range ranges[2];
};

#endif
