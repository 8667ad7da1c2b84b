package persist

import "github.com/sequencer-im/sequencer"

// Edits and recalls (docs/API.md, "Edit and Recall"). The conversation's
// writer decided that each event of a batch may change its target (the
// rules are conv.CheckEvent's); a store only writes: in the SAME
// transaction as the event's row (kind, target_msg_id and, for an edit, the
// new body), it updates the target row of the event's conversation:
//
//   - edit: body = the event's body, edit_count + 1, edited_at = the
//     event's server_at;
//   - recall: body emptied and recalled = true; the edit events of the
//     target lose their bodies too and are marked recalled (the recalled
//     text is gone for good, also from the edits that carried it). When
//     the batch says RecallsOfUnedited, its recalls' targets have no edit
//     events (its writer knows each target's edit count), and a store may
//     skip looking for them.
//
// The update names (conv_id, msg_id) and touches no row of another
// conversation; a target that is gone (trimmed) is left alone: the event
// still lands. The event and its target's update are one transaction:
// never one without the other.

// ApplyEvent changes the stored target as the event ev does (the stores
// that keep rows as values: persist/memstore).
func ApplyEvent(target *sequencer.Message, ev *sequencer.Message) {
	switch ev.Kind {
	case sequencer.KindEdit:
		target.Body = append([]byte{}, ev.Body...)
		target.EditCount++
		target.EditedAt = ev.ServerAt
	case sequencer.KindRecall:
		target.Body = []byte{}
		target.Recalled = true
	}
}

// RecallsEdit reports whether the recall ev removes the body of the stored
// message m (an edit event of ev's target).
func RecallsEdit(ev, m *sequencer.Message) bool {
	return ev.Kind == sequencer.KindRecall && m.Kind == sequencer.KindEdit && m.TargetMsgID == ev.TargetMsgID && m.ConvID == ev.ConvID
}
