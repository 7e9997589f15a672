/* The eBPF service load balancer's maps and the helpers every program
 * shares: both objects (sock_lb, tc_lb) declare the same maps, pinned by
 * name, so the loader of the second finds the first's and they share one
 * set of fronts, tables and backends.
 */
#ifndef CCA_LB_MAPS_H
#define CCA_LB_MAPS_H

#include "lb.h"

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

struct {
	/* Flows through a VIP from containers: two entries a flow (its way
	 * to the front, its way back from the backend); the least recently
	 * used go first when it is full. */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_CT);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_ct_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tc_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_tccfg_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_TC_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_tcstats_v1 SEC(".maps");

struct {
	/* Each CPU's reject budget: the time its token bucket is full
	 * again (see reject_allowed). */
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cca_rejbkt_v1 SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *value = bpf_map_lookup_elem(&cca_stats_v1, &stat);

	if (value)
		*value += 1;
}

static __always_inline void tc_count(__u32 stat)
{
	__u64 *value = bpf_map_lookup_elem(&cca_tcstats_v1, &stat);

	if (value)
		*value += 1;
}

/* The same mixing as cca_net::ebpf::maglev::mix (a 64-bit finaliser):
 * every node computes the same slot for the same flow and seed. */
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

enum lb_miss { LB_MISS_NONE, LB_MISS_TABLE, LB_MISS_BACKEND };

/* The backend of the slot `hash` falls in, in `front`'s live table
 * (`front` has backends); its id in *id when `id` is not null. Null when
 * the table or the backend is missing (the maps were edited by hand):
 * *miss says which. */
static __always_inline struct backend *pick(struct front *front, __u64 hash,
					    __u32 *id, enum lb_miss *miss)
{
	struct table_key table_key = {};
	struct backend *backend;
	__u32 slot;
	__u32 chosen;

	table_key.front = front->id;
	table_key.gen = front->gen;
	if (front->flags & LB_FRONT_SMALL) {
		struct small_table *table =
			bpf_map_lookup_elem(&cca_tsmall_v1, &table_key);

		if (!table) {
			*miss = LB_MISS_TABLE;
			return 0;
		}
		slot = hash % LB_SMALL_TABLE_SIZE;
		/* The verifier does not bound a remainder: hide the value
		 * from the compiler so the check stays for the verifier. */
		asm volatile("" : "+r"(slot));
		if (slot >= LB_SMALL_TABLE_SIZE) {
			*miss = LB_MISS_TABLE;
			return 0;
		}
		chosen = table->backend[slot];
	} else {
		struct table *table =
			bpf_map_lookup_elem(&cca_table_v1, &table_key);

		if (!table) {
			*miss = LB_MISS_TABLE;
			return 0;
		}
		slot = hash % LB_TABLE_SIZE;
		asm volatile("" : "+r"(slot));
		if (slot >= LB_TABLE_SIZE) {
			*miss = LB_MISS_TABLE;
			return 0;
		}
		chosen = table->backend[slot];
	}
	backend = bpf_map_lookup_elem(&cca_backend_v1, &chosen);
	if (!backend) {
		*miss = LB_MISS_BACKEND;
		return 0;
	}
	if (id)
		*id = chosen;
	return backend;
}

#endif
