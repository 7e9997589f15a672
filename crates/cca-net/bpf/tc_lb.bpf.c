// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/* Service load balancing for containers, on the node's end of each
 * instance's veth (tc, attached with TCX links).
 *
 * From the instance (ingress of the host end): a packet to a front (VIP,
 * port, protocol) of a flow the flow table knows goes to that flow's
 * backend; a new flow gets the backend its seeded 5-tuple hash picks in
 * the front's consistent-hash table (every node with the same seed picks
 * the same) and two entries in the flow table, one each way. Only the
 * destination is rewritten: the backend sees the client's own address.
 * To the instance (egress): a packet from a backend of a known flow gets
 * the front as its source again.
 *
 * A flow whose backend is its own client (hairpin) is sent straight back
 * into the instance with the front as its source, and so are its answers.
 *
 * A front without ready backends refuses a new flow: a TCP reset, or ICMP
 * (ICMPv6) port unreachable for UDP, written over the packet and sent back
 * into the instance. Flows the table already has keep their backend
 * (draining) until they end. Refusals are limited per CPU by a token
 * bucket; over it the packet is dropped, never reflected.
 *
 * Rebuild the checked-in object with scripts/bpf (clang 14, -target bpf).
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NS 1000000000ULL
/* A UDP flow idle this long is balanced afresh (conntrack's stream
 * timeout); a TCP flow after a FIN or reset, this long. An open TCP flow
 * never expires: only the table's least-recently-used eviction ends it. */
#define UDP_IDLE (120 * NS)
#define CLOSING_IDLE (60 * NS)

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define IP_DF 0x4000
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PORT_UNREACH 4
#define IPPROTO_ICMPV6_ 58
#define TTL 64

#define L3 ETH_HLEN
#define L4_V4 (ETH_HLEN + 20)
#define L4_V6 (ETH_HLEN + 40)

/* Not ours, or translated: the next program on the hook (TCX_NEXT), else
 * the kernel, takes the packet on. */
#define NEXT TC_ACT_UNSPEC

enum parsed { PARSE_OK, PARSE_SKIP, PARSE_ODD };

/* What the programs read of a packet. */
struct packet {
	struct ct_key key; /* as the packet goes (dir set by the caller) */
	__u32 l4;          /* offset of the TCP or UDP header */
	__u32 payload;     /* bytes after the IP header */
	__u8 v6;
	__u8 tcp_flags;
	__u8 tcp_doff;     /* TCP header words */
	__u8 pad;
	__u32 seq;         /* TCP, network order */
	__u32 ack_seq;
};

struct tcp_head {
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack_seq;
	__u8 doff; /* high nibble */
	__u8 flags;
	__u16 window;
	__u16 check;
	__u16 urg_ptr;
};

static __always_inline enum parsed parse(struct __sk_buff *skb, struct packet *p)
{
	__u16 ports[2];

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, L3, &ip, sizeof(ip)))
			return PARSE_SKIP;
		if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
			return PARSE_SKIP;
		p->key.saddr[2] = bpf_htonl(0xffff);
		p->key.saddr[3] = ip.saddr;
		p->key.daddr[2] = bpf_htonl(0xffff);
		p->key.daddr[3] = ip.daddr;
		p->key.proto = ip.protocol;
		if (ip.ihl != 5 || (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return PARSE_ODD;
		p->l4 = L4_V4;
		p->payload = bpf_ntohs(ip.tot_len) - 20;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, L3, &ip6, sizeof(ip6)))
			return PARSE_SKIP;
		/* Extension headers are not followed: such packets go on
		 * to the kernel's rules. */
		if (ip6.nexthdr != IPPROTO_TCP && ip6.nexthdr != IPPROTO_UDP)
			return PARSE_SKIP;
		__builtin_memcpy(p->key.saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->key.daddr, &ip6.daddr, 16);
		p->key.proto = ip6.nexthdr;
		p->l4 = L4_V6;
		p->payload = bpf_ntohs(ip6.payload_len);
		p->v6 = 1;
	} else {
		return PARSE_SKIP;
	}
	if (bpf_skb_load_bytes(skb, p->l4, ports, sizeof(ports)))
		return PARSE_SKIP;
	p->key.sport = ports[0];
	p->key.dport = ports[1];
	if (p->key.proto == IPPROTO_TCP) {
		struct tcp_head tcp;

		if (bpf_skb_load_bytes(skb, p->l4, &tcp, sizeof(tcp)))
			return PARSE_SKIP;
		p->tcp_flags = tcp.flags;
		p->tcp_doff = tcp.doff >> 4;
		p->seq = tcp.seq;
		p->ack_seq = tcp.ack_seq;
	}
	return PARSE_OK;
}

static __always_inline int in_range(const __u32 *addr)
{
	__u32 zero = 0;
	struct tc_config *tc = bpf_map_lookup_elem(&cca_tccfg_v1, &zero);

	if (!tc)
		return 1;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		struct lb_range *range = &tc->ranges[i];

		if ((addr[0] & range->mask[0]) == range->net[0] &&
		    (addr[1] & range->mask[1]) == range->net[1] &&
		    (addr[2] & range->mask[2]) == range->net[2] &&
		    (addr[3] & range->mask[3]) == range->net[3])
			return 1;
	}
	return 0;
}

static __always_inline int same_addr(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline int mapped(const __u32 *addr)
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

/* The seeded hash of a flow: of its client address alone with affinity,
 * else of its 5-tuple. cca_net::ebpf::maglev::flow_hash is the same. */
static __always_inline __u64 flow_hash(__u64 seed, const struct ct_key *key,
				       int affinity)
{
	__u64 h = seed;

	h = mix(h ^ (((__u64)key->saddr[0] << 32) | key->saddr[1]));
	h = mix(h ^ (((__u64)key->saddr[2] << 32) | key->saddr[3]));
	if (affinity)
		return h;
	h = mix(h ^ (((__u64)key->daddr[0] << 32) | key->daddr[1]));
	h = mix(h ^ (((__u64)key->daddr[2] << 32) | key->daddr[3]));
	return mix(h ^ (((__u64)key->sport << 24) | ((__u64)key->dport << 8) |
			key->proto));
}

static __always_inline __u32 l4_check(const struct packet *p)
{
	return p->l4 + (p->key.proto == IPPROTO_TCP ? 16 : 6);
}

/* An IPv4 UDP datagram without a checksum keeps none. */
static __always_inline __u64 l4_flags(const struct packet *p)
{
	return p->key.proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Rewrites the source (dst 0) or destination address from `from` to `to`
 * with the checksums. */
static __always_inline int set_addr(struct __sk_buff *skb, const struct packet *p,
				    int dst, const __u32 *from, const __u32 *to)
{
	if (!p->v6) {
		__u32 off = L3 + (dst ? 16 : 12);

		if (bpf_l4_csum_replace(skb, l4_check(p), from[3], to[3],
					BPF_F_PSEUDO_HDR | l4_flags(p) | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, L3 + 10, from[3], to[3], 4))
			return -1;
		return bpf_skb_store_bytes(skb, off, &to[3], 4, 0);
	}
	__s64 diff = bpf_csum_diff((__be32 *)from, 16, (__be32 *)to, 16, 0);

	if (bpf_l4_csum_replace(skb, l4_check(p), 0, diff,
				BPF_F_PSEUDO_HDR | l4_flags(p)))
		return -1;
	return bpf_skb_store_bytes(skb, L3 + (dst ? 24 : 8), to, 16, 0);
}

static __always_inline int set_port(struct __sk_buff *skb, const struct packet *p,
				    int dst, __u16 from, __u16 to)
{
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, l4_check(p), from, to, l4_flags(p) | 2))
		return -1;
	return bpf_skb_store_bytes(skb, p->l4 + (dst ? 2 : 0), &to, 2, 0);
}

/* Swaps the Ethernet addresses, for a packet sent back where it came
 * from. */
static __always_inline int swap_macs(struct __sk_buff *skb)
{
	__u8 macs[12];
	__u8 swapped[12];

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return -1;
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	return bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0);
}

static __always_inline int back_to_instance(struct __sk_buff *skb)
{
	if (swap_macs(skb))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* Whether a flow's entry still holds: not idle past its time, its
 * backend still the one the id names. */
static __always_inline int live(const struct ct_entry *entry,
				const struct packet *p, __u64 now)
{
	__u64 idle = now > entry->seen ? now - entry->seen : 0;
	struct backend *backend;

	if ((entry->flags & LB_CT_CLOSING) && idle > CLOSING_IDLE)
		return 0;
	if (p->key.proto == IPPROTO_UDP && idle > UDP_IDLE)
		return 0;
	backend = bpf_map_lookup_elem(&cca_backend_v1, &entry->backend);
	if (!backend || backend->port != entry->port ||
	    !same_addr(backend->addr, entry->addr)) {
		tc_count(LB_TC_RESELECTED);
		return 0;
	}
	return 1;
}

static __always_inline void touch(struct ct_entry *entry, const struct packet *p,
				  __u64 now)
{
	if (p->key.proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FIN | TCP_RST)) &&
	    !(entry->flags & LB_CT_CLOSING))
		entry->flags |= LB_CT_CLOSING;
	if (now - entry->seen > NS)
		entry->seen = now;
}

/* Sends a packet of a known flow on to its backend. */
static __always_inline int forward(struct __sk_buff *skb, const struct packet *p,
				   const struct ct_entry *entry)
{
	__u32 backend[4];
	__u16 port = entry->port;

	__builtin_memcpy(backend, entry->addr, sizeof(backend));
	if (entry->flags & LB_CT_HAIRPIN) {
		/* From the front to the instance itself: it would drop a
		 * packet from its own address as a martian. */
		if (set_addr(skb, p, 0, p->key.saddr, p->key.daddr) ||
		    set_addr(skb, p, 1, p->key.daddr, backend) ||
		    set_port(skb, p, 1, p->key.dport, port))
			return TC_ACT_SHOT;
		return back_to_instance(skb);
	}
	if (set_addr(skb, p, 1, p->key.daddr, backend) ||
	    set_port(skb, p, 1, p->key.dport, port))
		return TC_ACT_SHOT;
	return NEXT;
}

/* A hairpin flow's answer (instance:backend port → front:client port):
 * from the front's address and port to the client's. */
static __always_inline int hairpin_back(struct __sk_buff *skb, const struct packet *p,
					const struct ct_entry *entry)
{
	__u32 front[4];
	__u16 port = entry->port;

	__builtin_memcpy(front, entry->addr, sizeof(front));
	if (set_addr(skb, p, 1, p->key.daddr, p->key.saddr) ||
	    set_addr(skb, p, 0, p->key.saddr, front) ||
	    set_port(skb, p, 0, p->key.sport, port))
		return TC_ACT_SHOT;
	return back_to_instance(skb);
}

/* A new flow to `front`: picks its backend and records the flow both
 * ways (the way back first, so no answer misses it). */
static __always_inline int balance(struct __sk_buff *skb, struct packet *p,
				   struct front *front, __u64 now)
{
	struct lb_config *cfg = config();
	enum lb_miss miss = LB_MISS_NONE;
	struct ct_entry entry = {};
	struct ct_entry back = {};
	struct ct_key back_key = {};
	struct backend *backend;
	__u32 id = 0;

	if (!cfg)
		return NEXT;
	backend = pick(front, flow_hash(cfg->seed, &p->key,
					front->flags & LB_FRONT_AFFINITY),
		       &id, &miss);
	if (!backend) {
		tc_count(miss == LB_MISS_TABLE ? LB_TC_NO_TABLE : LB_TC_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	if (mapped(backend->addr) == p->v6) {
		tc_count(LB_TC_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(entry.addr, backend->addr, sizeof(entry.addr));
	entry.port = backend->port;
	entry.backend = id;
	entry.seen = now;
	if (same_addr(backend->addr, p->key.saddr))
		entry.flags = LB_CT_HAIRPIN;
	__builtin_memcpy(back.addr, p->key.daddr, sizeof(back.addr));
	back.port = p->key.dport;
	back.flags = entry.flags;
	back.backend = id;
	back.seen = now;
	__builtin_memcpy(back_key.saddr, backend->addr, sizeof(back_key.saddr));
	back_key.sport = backend->port;
	if (entry.flags & LB_CT_HAIRPIN)
		__builtin_memcpy(back_key.daddr, p->key.daddr, sizeof(back_key.daddr));
	else
		__builtin_memcpy(back_key.daddr, p->key.saddr, sizeof(back_key.daddr));
	back_key.dport = p->key.sport;
	back_key.proto = p->key.proto;
	back_key.dir = LB_CT_REVERSE;
	if (bpf_map_update_elem(&cca_ct_v1, &back_key, &back, BPF_ANY) ||
	    bpf_map_update_elem(&cca_ct_v1, &p->key, &entry, BPF_ANY))
		return TC_ACT_SHOT;
	tc_count(LB_TC_FLOWS);
	if (entry.flags & LB_CT_HAIRPIN)
		tc_count(LB_TC_HAIRPIN);
	return forward(skb, p, &entry);
}

/* Whether this CPU may send one more refusal: a token bucket kept as the
 * time it is full again (GCRA), LB_REJECT_RATE a second, LB_REJECT_BURST
 * at once. */
static __always_inline int reject_allowed(__u64 now)
{
	const __u64 interval = NS / LB_REJECT_RATE;
	const __u64 tolerance = (LB_REJECT_BURST - 1) * interval;
	__u32 zero = 0;
	__u64 *full = bpf_map_lookup_elem(&cca_rejbkt_v1, &zero);
	__u64 at;

	if (!full)
		return 0;
	at = *full > now ? *full : now;
	if (at - now > tolerance)
		return 0;
	*full = at + interval;
	return 1;
}

static __always_inline __u16 fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

struct pseudo4 {
	__u32 saddr;
	__u32 daddr;
	__u8 zero;
	__u8 proto;
	__u16 len;
};

struct pseudo6 {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 len;
	__u8 zero[3];
	__u8 next;
};

/* Writes an IP header from the front (the packet's destination) back to
 * the client, carrying `len` bytes of `proto`; the l4 checksum's
 * pseudo-header sum in *sum. */
static __always_inline int answer_head(struct __sk_buff *skb, const struct packet *p,
				       __u8 proto, __u16 len, __s64 *sum)
{
	if (!p->v6) {
		struct iphdr ip = {};
		struct pseudo4 pseudo = {};

		ip.version = 4;
		ip.ihl = 5;
		ip.tot_len = bpf_htons(20 + len);
		ip.frag_off = bpf_htons(IP_DF);
		ip.ttl = TTL;
		ip.protocol = proto;
		ip.saddr = p->key.daddr[3];
		ip.daddr = p->key.saddr[3];
		ip.check = fold(bpf_csum_diff(0, 0, (__be32 *)&ip, sizeof(ip), 0));
		pseudo.saddr = ip.saddr;
		pseudo.daddr = ip.daddr;
		pseudo.proto = proto;
		pseudo.len = bpf_htons(len);
		/* ICMP has no pseudo-header. */
		*sum = proto == IPPROTO_TCP ?
			bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0) : 0;
		return bpf_skb_store_bytes(skb, L3, &ip, sizeof(ip), 0);
	}
	struct ipv6hdr ip6 = {};
	struct pseudo6 pseudo = {};

	ip6.version = 6;
	ip6.payload_len = bpf_htons(len);
	ip6.nexthdr = proto;
	ip6.hop_limit = TTL;
	__builtin_memcpy(&ip6.saddr, p->key.daddr, 16);
	__builtin_memcpy(&ip6.daddr, p->key.saddr, 16);
	__builtin_memcpy(pseudo.saddr, p->key.daddr, 16);
	__builtin_memcpy(pseudo.daddr, p->key.saddr, 16);
	pseudo.len = bpf_htonl(len);
	pseudo.next = proto;
	*sum = bpf_csum_diff(0, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	return bpf_skb_store_bytes(skb, L3, &ip6, sizeof(ip6), 0);
}

/* The packet becomes the TCP reset a closed port answers it with. */
static __always_inline int reset(struct __sk_buff *skb, const struct packet *p)
{
	struct tcp_head tcp = {};
	__u32 l4 = p->v6 ? L4_V6 : L4_V4;
	__u32 data = p->payload - p->tcp_doff * 4;
	__s64 sum = 0;

	tcp.source = p->key.dport;
	tcp.dest = p->key.sport;
	tcp.doff = 5 << 4;
	if (p->tcp_flags & TCP_ACK) {
		tcp.seq = p->ack_seq;
		tcp.flags = TCP_RST;
	} else {
		data += (p->tcp_flags & TCP_SYN ? 1 : 0) + (p->tcp_flags & TCP_FIN ? 1 : 0);
		tcp.ack_seq = bpf_htonl(bpf_ntohl(p->seq) + data);
		tcp.flags = TCP_RST | TCP_ACK;
	}
	if (bpf_skb_change_tail(skb, l4 + sizeof(tcp), 0))
		return -1;
	if (answer_head(skb, p, IPPROTO_TCP, sizeof(tcp), &sum))
		return -1;
	tcp.check = fold(bpf_csum_diff(0, 0, (__be32 *)&tcp, sizeof(tcp), sum));
	return bpf_skb_store_bytes(skb, l4, &tcp, sizeof(tcp), 0);
}

/* The packet becomes an ICMP (ICMPv6) port unreachable carrying its own
 * IP header and first 8 bytes of UDP, as a closed port answers. */
static __always_inline int unreachable(struct __sk_buff *skb, const struct packet *p)
{
	__u8 icmp[8] = {};
	__s64 sum = 0;

	if (!p->v6) {
		__u32 quoted[7]; /* the IP header and the UDP header */

		if (bpf_skb_load_bytes(skb, L3, quoted, sizeof(quoted)) ||
		    bpf_skb_change_tail(skb, L4_V4 + sizeof(icmp) + sizeof(quoted), 0) ||
		    answer_head(skb, p, IPPROTO_ICMP, sizeof(icmp) + sizeof(quoted), &sum))
			return -1;
		icmp[0] = ICMP_DEST_UNREACH;
		icmp[1] = ICMP_PORT_UNREACH;
		sum = bpf_csum_diff(0, 0, (__be32 *)icmp, sizeof(icmp), sum);
		sum = bpf_csum_diff(0, 0, quoted, sizeof(quoted), sum);
		*(__u16 *)&icmp[2] = fold(sum);
		if (bpf_skb_store_bytes(skb, L4_V4, icmp, sizeof(icmp), 0))
			return -1;
		return bpf_skb_store_bytes(skb, L4_V4 + sizeof(icmp), quoted,
					   sizeof(quoted), 0);
	}
	__u32 quoted[12]; /* the IPv6 header and the UDP header */

	if (bpf_skb_load_bytes(skb, L3, quoted, sizeof(quoted)) ||
	    bpf_skb_change_tail(skb, L4_V6 + sizeof(icmp) + sizeof(quoted), 0) ||
	    answer_head(skb, p, IPPROTO_ICMPV6_, sizeof(icmp) + sizeof(quoted), &sum))
		return -1;
	icmp[0] = ICMPV6_DEST_UNREACH;
	icmp[1] = ICMPV6_PORT_UNREACH;
	sum = bpf_csum_diff(0, 0, (__be32 *)icmp, sizeof(icmp), sum);
	sum = bpf_csum_diff(0, 0, quoted, sizeof(quoted), sum);
	*(__u16 *)&icmp[2] = fold(sum);
	if (bpf_skb_store_bytes(skb, L4_V6, icmp, sizeof(icmp), 0))
		return -1;
	return bpf_skb_store_bytes(skb, L4_V6 + sizeof(icmp), quoted, sizeof(quoted), 0);
}

/* A new flow to a front without ready backends. */
static __always_inline int refuse(struct __sk_buff *skb, const struct packet *p,
				  __u64 now)
{
	int tcp = p->key.proto == IPPROTO_TCP;

	/* A reset is never answered. */
	if (tcp && (p->tcp_flags & TCP_RST))
		return TC_ACT_SHOT;
	if (!reject_allowed(now)) {
		tc_count(LB_TC_LIMITED);
		return TC_ACT_SHOT;
	}
	if (tcp ? reset(skb, p) : unreachable(skb, p))
		return TC_ACT_SHOT;
	tc_count(tcp ? LB_TC_RESET : LB_TC_UNREACHABLE);
	return back_to_instance(skb);
}

SEC("classifier")
int cca_tc_from_instance(struct __sk_buff *skb)
{
	struct packet p = {};
	struct front_key front_key = {};
	struct ct_entry *entry;
	struct front *front;
	enum parsed parsed = parse(skb, &p);
	__u64 now;

	if (parsed == PARSE_SKIP || !in_range(p.key.daddr))
		return NEXT;
	if (parsed == PARSE_ODD) {
		tc_count(LB_TC_PASSED);
		return NEXT;
	}
	now = bpf_ktime_get_ns();
	p.key.dir = LB_CT_FORWARD;
	entry = bpf_map_lookup_elem(&cca_ct_v1, &p.key);
	if (entry && live(entry, &p, now)) {
		touch(entry, &p, now);
		return forward(skb, &p, entry);
	}
	p.key.dir = LB_CT_REVERSE;
	entry = bpf_map_lookup_elem(&cca_ct_v1, &p.key);
	if (entry && (entry->flags & LB_CT_HAIRPIN))
		return hairpin_back(skb, &p, entry);
	p.key.dir = LB_CT_FORWARD;
	__builtin_memcpy(front_key.addr, p.key.daddr, sizeof(front_key.addr));
	front_key.port = p.key.dport;
	front_key.proto = p.key.proto;
	front = bpf_map_lookup_elem(&cca_front_v1, &front_key);
	if (!front)
		return NEXT;
	if (front->count == 0)
		return refuse(skb, &p, now);
	return balance(skb, &p, front, now);
}

SEC("classifier")
int cca_tc_to_instance(struct __sk_buff *skb)
{
	struct packet p = {};
	struct ct_entry *entry;
	__u32 front[4];
	__u16 port;

	if (parse(skb, &p) != PARSE_OK)
		return NEXT;
	p.key.dir = LB_CT_REVERSE;
	entry = bpf_map_lookup_elem(&cca_ct_v1, &p.key);
	if (!entry || (entry->flags & LB_CT_HAIRPIN))
		return NEXT;
	__builtin_memcpy(front, entry->addr, sizeof(front));
	port = entry->port;
	if (p.key.proto == IPPROTO_TCP && (p.tcp_flags & (TCP_FIN | TCP_RST))) {
		/* The backend ends the flow: its forward entry closes. */
		struct ct_key forward_key = {};
		struct ct_entry *forward_entry;

		__builtin_memcpy(forward_key.saddr, p.key.daddr, 16);
		__builtin_memcpy(forward_key.daddr, front, 16);
		forward_key.sport = p.key.dport;
		forward_key.dport = port;
		forward_key.proto = p.key.proto;
		forward_entry = bpf_map_lookup_elem(&cca_ct_v1, &forward_key);
		if (forward_entry)
			forward_entry->flags |= LB_CT_CLOSING;
	}
	if (set_addr(skb, &p, 0, p.key.saddr, front) ||
	    set_port(skb, &p, 0, p.key.sport, port))
		return TC_ACT_SHOT;
	return NEXT;
}
