package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// rolloutsCommand is `rollouts create|get|list|pause|resume|abort`: bcd
// releases rolled out to a pool in waves (platform operators).
func (a *app) rolloutsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "rollouts", Aliases: []string{"rollout"}, Short: "Roll a bcd release out to a pool in waves (platform operators)"}
	var (
		rel, pool, waves                string
		maxUnavailable                  int32
		pauseBetween, soak, revertAfter time.Duration
	)
	create := &cobra.Command{
		Use:   "create --release V --pool P --waves 1,10%,50%,100% [--max-unavailable N] [--pause-between 10m] [--soak 2m]",
		Short: "Start rolling a published release out to a pool",
		Long: `Start rolling a published bcd release out to a pool's nodes (fixed now, by name).
--waves are cumulative sizes, each a node count or a percentage of the pool, ascending,
the last 100%. In each wave at most --max-unavailable nodes upgrade at once; each must
come back Ready on the release with no new health finding and stay so for --soak; then
the next wave starts after --pause-between. A failed upgrade, a node not back within
--revert-after plus a minute, or a health finding halts the rollout and rolls the wave
back. See docs/releases.md.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			req := &apiv1.CreateRolloutRequest{Release: rel, Pool: pool, MaxUnavailable: maxUnavailable}
			for _, w := range strings.Split(waves, ",") {
				if w = strings.TrimSpace(w); w != "" {
					req.Waves = append(req.Waves, w)
				}
			}
			for _, d := range []struct {
				flag string
				v    time.Duration
				to   **durationpb.Duration
			}{{"pause-between", pauseBetween, &req.PauseBetween}, {"soak", soak, &req.Soak}, {"revert-after", revertAfter, &req.RevertAfter}} {
				if cmd.Flags().Changed(d.flag) {
					*d.to = durationpb.New(d.v)
				}
			}
			var resp *connect.Response[apiv1.CreateRolloutResponse]
			m := newCreate("")
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Rollouts.Create(cmd.Context(), request(req, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printRollout(cmd, resp.Msg, resp.Msg.GetRollout())
		},
	}
	create.Flags().StringVar(&rel, "release", "", "the published release's version (v1.4.0)")
	create.Flags().StringVar(&pool, "pool", "", "the pool: its id (pol_…) or name")
	create.Flags().StringVar(&waves, "waves", "1,10%,50%,100%", "cumulative wave sizes: node counts or percentages, the last 100%")
	create.Flags().Int32Var(&maxUnavailable, "max-unavailable", 1, "nodes of a wave upgrading at once")
	create.Flags().DurationVar(&pauseBetween, "pause-between", 0, "wait between waves")
	create.Flags().DurationVar(&soak, "soak", 2*time.Minute, "how long each node must stay healthy on the release")
	create.Flags().DurationVar(&revertAfter, "revert-after", 2*time.Minute, "bcd restores its previous binary if it cannot reach the gateway this long after restarting")

	get := &cobra.Command{
		Use:   "get ROLLOUT",
		Short: "Show a rollout and its nodes",
		Args:  positional("ROLLOUT"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.Rollouts.Get(cmd.Context(), connect.NewRequest(&apiv1.GetRolloutRequest{Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printRollout(cmd, resp.Msg, resp.Msg.GetRollout())
		},
	}

	var listPool, listState string
	var limit int
	list := &cobra.Command{
		Use:   "list [--pool P] [--state S]",
		Short: "List rollouts",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			out := &apiv1.ListRolloutsResponse{}
			token := ""
			for {
				size := int32(100)
				if limit > 0 {
					size = int32(min(100, limit-len(out.Rollouts)))
				}
				resp, err := c.Rollouts.List(cmd.Context(), connect.NewRequest(&apiv1.ListRolloutsRequest{Pool: listPool, State: listState,
					PageSize: size, PageToken: token}))
				if err != nil {
					return err
				}
				out.Rollouts = append(out.Rollouts, resp.Msg.GetRollouts()...)
				token = resp.Msg.GetNextPageToken()
				if token == "" || (limit > 0 && len(out.Rollouts) >= limit) {
					break
				}
			}
			return a.printer(cmd.OutOrStdout()).print(out, func(w io.Writer) { rolloutTable(w, out.GetRollouts()) })
		},
	}
	list.Flags().StringVar(&listPool, "pool", "", "only this pool's rollouts")
	list.Flags().StringVar(&listState, "state", "", "running, paused, halted, rolled_back, completed or aborted")
	addLimitFlag(list, &limit)

	verb := func(use, short string, call func(cmd *cobra.Command, id string) (*apiv1.Rollout, proto.Message, error)) *cobra.Command {
		return &cobra.Command{
			Use:   use + " ROLLOUT",
			Short: short,
			Args:  positional("ROLLOUT"),
			RunE: func(cmd *cobra.Command, argv []string) error {
				r, msg, err := call(cmd, argv[0])
				if err != nil {
					return err
				}
				return a.printRollout(cmd, msg, r)
			},
		}
	}
	pause := verb("pause", "Stop sending upgrades (commands in flight finish and are watched)", func(cmd *cobra.Command, id string) (*apiv1.Rollout, proto.Message, error) {
		c, err := a.client()
		if err != nil {
			return nil, nil, err
		}
		resp, err := c.Rollouts.Pause(cmd.Context(), request(&apiv1.PauseRolloutRequest{Id: id}, mutation{}))
		if err != nil {
			return nil, nil, err
		}
		return resp.Msg.GetRollout(), resp.Msg, nil
	})
	resume := verb("resume", "Continue a paused rollout", func(cmd *cobra.Command, id string) (*apiv1.Rollout, proto.Message, error) {
		c, err := a.client()
		if err != nil {
			return nil, nil, err
		}
		resp, err := c.Rollouts.Resume(cmd.Context(), request(&apiv1.ResumeRolloutRequest{Id: id}, mutation{}))
		if err != nil {
			return nil, nil, err
		}
		return resp.Msg.GetRollout(), resp.Msg, nil
	})
	abort := verb("abort", "End a rollout where it stands (nothing more is sent; nothing is rolled back)", func(cmd *cobra.Command, id string) (*apiv1.Rollout, proto.Message, error) {
		c, err := a.client()
		if err != nil {
			return nil, nil, err
		}
		resp, err := c.Rollouts.Abort(cmd.Context(), request(&apiv1.AbortRolloutRequest{Id: id}, mutation{}))
		if err != nil {
			return nil, nil, err
		}
		return resp.Msg.GetRollout(), resp.Msg, nil
	})
	cmd.AddCommand(create, get, list, pause, resume, abort)
	return cmd
}

func (a *app) printRollout(cmd *cobra.Command, msg proto.Message, r *apiv1.Rollout) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		rolloutTable(w, []*apiv1.Rollout{r})
		if r.GetMessage() != "" {
			fmt.Fprintf(w, "\n%s\n", r.GetMessage())
		}
		if len(r.GetNodes()) > 0 {
			fmt.Fprintln(w)
			row(w, "NODE", "WAVE", "FROM", "STATE", "COMMAND", "ROLLBACK", "MESSAGE")
			for _, n := range r.GetNodes() {
				row(w, n.GetNode(), fmt.Sprint(n.GetWave()+1), dash(n.GetFromVersion()), n.GetState(), dash(n.GetCommandId()),
					dash(n.GetRollbackCommandId()), dash(n.GetMessage()))
			}
		}
	})
}

func rolloutTable(w io.Writer, rs []*apiv1.Rollout) {
	row(w, "ID", "RELEASE", "POOL", "STATE", "WAVE", "WAVES", "NODES", "CREATED")
	for _, r := range rs {
		var states []string
		for s, n := range r.GetNodeStates() {
			states = append(states, fmt.Sprintf("%s=%d", s, n))
		}
		sort.Strings(states)
		row(w, r.GetId(), r.GetRelease(), r.GetPool(), r.GetState(), fmt.Sprintf("%d/%d", r.GetCurrentWave()+1, len(r.GetWaves())),
			strings.Join(r.GetWaves(), ","), dash(strings.Join(states, " ")), ts(r.GetCreateTime()))
	}
}
