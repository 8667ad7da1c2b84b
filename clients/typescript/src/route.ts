// The routing cache: conv_id -> partition (bounded, least recently used
// forgotten) and partition -> owner (docs/CLIENTS.md, "Routing").

/** Route is the owner of a conversation as a node sees it now. */
export interface Route {
  nodeId: string;
  /** The owner's API address (host:port); "" if it advertised none. */
  address: string;
  partition: number;
  /** The owner's lease epoch of the partition (0n: not taken yet or unknown). */
  epoch: bigint;
  /** The membership view the answer was computed from. */
  membershipVersion: bigint;
}

/** An owner as last learned; N is the client's node handle. */
export interface Owner<N> {
  node: N | undefined;
  nodeId: string;
  epoch: bigint;
  membershipVersion: bigint;
}

function newer<N>(o: Owner<N>, p: Owner<N>): boolean {
  if (o.membershipVersion !== p.membershipVersion) {
    return o.membershipVersion > p.membershipVersion;
  }
  return o.epoch >= p.epoch;
}

export class RouteCache<N> {
  // Map keeps insertion order: the first key is the least recently used.
  private convs = new Map<string, number>();
  private owners = new Map<number, Owner<N>>();
  /**
   * The newest membership version a node named in a send's answer (header
   * Sequencer-Membership-Version): an owner learned under an older view is
   * not used, its conversation asks Route again.
   */
  private seen = 0n;

  constructor(private readonly max: number) {}

  /** saw records the membership version a node answered with. */
  saw(version: bigint): void {
    if (version > this.seen) {
      this.seen = version;
    }
  }

  /** lookup returns the cached owner node of convId, unless it was learned under an older view than one seen since. */
  lookup(convId: string): N | undefined {
    const p = this.convs.get(convId);
    if (p === undefined) {
      return undefined;
    }
    this.convs.delete(convId);
    this.convs.set(convId, p);
    const o = this.owners.get(p);
    return o && o.membershipVersion >= this.seen ? o.node : undefined;
  }

  /**
   * learn records a Route answer. An answer from an older membership view
   * than the cached one (a lagging node) does not replace it. An owner
   * without a node (no usable address) forgets the partition's owner. It
   * returns the owner node now cached for the partition.
   */
  learn(convId: string, partition: number, o: Owner<N>): N | undefined {
    if (this.max > 0) {
      this.convs.delete(convId);
      this.convs.set(convId, partition);
      while (this.convs.size > this.max) {
        const oldest = this.convs.keys().next().value as string;
        this.convs.delete(oldest);
      }
    }
    const cur = this.owners.get(partition);
    if (cur && !newer(o, cur)) {
      return cur.node;
    }
    if (o.node === undefined) {
      this.owners.delete(partition);
      return undefined;
    }
    this.owners.set(partition, o);
    return o.node;
  }

  /** forgetConv drops the cached owner of convId's partition. */
  forgetConv(convId: string): void {
    const p = this.convs.get(convId);
    if (p !== undefined) {
      this.owners.delete(p);
    }
  }

  /** forgetNode drops every partition owned by n and returns how many. */
  forgetNode(n: N): number {
    let dropped = 0;
    for (const [p, o] of this.owners) {
      if (o.node === n) {
        this.owners.delete(p);
        dropped++;
      }
    }
    return dropped;
  }

  /** size is the number of conversations remembered. */
  get size(): number {
    return this.convs.size;
  }
}
