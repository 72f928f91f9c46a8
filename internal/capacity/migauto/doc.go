// Package migauto runs MIG that follows demand: a periodic job
// (capacity.mig_repartition) that, for every active pool whose policy says
// mig: auto, reads the pool's demand per MIG profile (its queue, and the
// creates refused for want of capacity that no round has answered yet,
// within Window) and its GPUs' layouts,
// asks migplan for new layouts of idle GPUs, and for each proposal freezes
// the GPU (GpuPartitionPending, in the transaction that re-checks that no
// booking holds it) and sends the node a signed gpu.mig.configure command
// in that same transaction. The node applies it and reports its new
// inventory; the atoms reconcile clears the condition once the layout
// shows, and wakes the pool's placer. A freeze that does not land within
// FreezeTimeout is thawed by a later round.
//
// Demand is per pool: one pool's queue never moves another pool's GPUs,
// whoever owns them. It must never write atoms or bookings itself: the
// freeze goes through the atoms reconciler, and commands through the
// fleet's path.
package migauto
