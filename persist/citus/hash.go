package citus

import "math/bits"

// citusHash is the hash Citus distributes a VARCHAR/TEXT column by:
// PostgreSQL's hashtext (hash_bytes, Bob Jenkins' lookup3, as in
// src/common/hashfn.c) of the value's bytes, as int32. TestCitusHash checks
// it against get_shard_id_for_distribution_column.
func citusHash(k []byte) int32 {
	rot := bits.RotateLeft32
	a := 0x9e3779b9 + uint32(len(k)) + 3923095
	b, c := a, a
	for len(k) >= 12 {
		a += uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
		b += uint32(k[4]) | uint32(k[5])<<8 | uint32(k[6])<<16 | uint32(k[7])<<24
		c += uint32(k[8]) | uint32(k[9])<<8 | uint32(k[10])<<16 | uint32(k[11])<<24
		a -= c
		a ^= rot(c, 4)
		c += b
		b -= a
		b ^= rot(a, 6)
		a += c
		c -= b
		c ^= rot(b, 8)
		b += a
		a -= c
		a ^= rot(c, 16)
		c += b
		b -= a
		b ^= rot(a, 19)
		a += c
		c -= b
		c ^= rot(b, 4)
		b += a
		k = k[12:]
	}
	n := len(k)
	if n >= 11 {
		c += uint32(k[10]) << 24
	}
	if n >= 10 {
		c += uint32(k[9]) << 16
	}
	if n >= 9 {
		c += uint32(k[8]) << 8
	}
	if n >= 8 {
		b += uint32(k[7]) << 24
	}
	if n >= 7 {
		b += uint32(k[6]) << 16
	}
	if n >= 6 {
		b += uint32(k[5]) << 8
	}
	if n >= 5 {
		b += uint32(k[4])
	}
	if n >= 4 {
		a += uint32(k[3]) << 24
	}
	if n >= 3 {
		a += uint32(k[2]) << 16
	}
	if n >= 2 {
		a += uint32(k[1]) << 8
	}
	if n >= 1 {
		a += uint32(k[0])
	}
	c ^= b
	c -= rot(b, 14)
	a ^= c
	a -= rot(c, 11)
	b ^= a
	b -= rot(a, 25)
	c ^= b
	c -= rot(b, 16)
	a ^= c
	a -= rot(c, 4)
	b ^= a
	b -= rot(a, 14)
	c ^= b
	c -= rot(b, 24)
	return int32(c)
}
