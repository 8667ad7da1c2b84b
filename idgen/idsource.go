package idgen

// NextID is Next, under the name actor.IDSource asks for
// (actor.IDSource, conv.IDSource).
func (g *Generator) NextID() (uint64, error) { return g.Next() }

// NextID is Next, under the name actor.IDSource asks for.
func (l *Issuer) NextID() (uint64, error) { return l.Next() }
