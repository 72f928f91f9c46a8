package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) webhooksCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Aliases: []string{"webhook"}, Short: "Manage a tenant's signed webhook endpoints and their deliveries"}
	var tenant, confirmationID string

	var (
		url, description string
		types            []string
	)
	create := &cobra.Command{
		Use:   "create --tenant T --url URL [--types reservation.*,node.lost]",
		Short: "Register an endpoint and print its signing secret once",
		Long: `Register an endpoint that receives the tenant's events as CloudEvents signed by
the Standard Webhooks scheme. --types takes event types or globs (reservation.*);
none means every event. The endpoint starts with events committed after it is
created. Endpoints on loopback or private addresses are refused unless the
operator runs the server with --webhook-allow-private; link-local, cloud
metadata, multicast and unspecified addresses and the API itself always are.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateWebhookResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Webhooks.Create(cmd.Context(), request(&apiv1.CreateWebhookRequest{Tenant: t, Url: url, Types: types,
					Description: description}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				webhookTable(w, resp.Msg.GetWebhook())
				fmt.Fprintf(w, "\nsecret: %s  (shown once; store it now)\n", resp.Msg.GetSecret())
			})
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&url, "url", "", "the endpoint's http(s) URL")
	create.Flags().StringSliceVar(&types, "types", nil, "event types or globs, comma-separated (default: every event)")
	create.Flags().StringVar(&description, "description", "", "what the endpoint is for")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get WEBHOOK",
		Short: "Show an endpoint",
		Args:  positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Webhooks.Get(cmd.Context(), connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: t, Webhook: argv[0]}))
			if err != nil {
				return err
			}
			return a.printWebhooks(cmd, resp.Msg, resp.Msg.GetWebhook())
		},
	}
	addTenantFlag(get, &tenant)

	var limit int
	list := &cobra.Command{
		Use:   "list --tenant T",
		Short: "List a tenant's endpoints",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Webhook, string, error) {
				resp, err := c.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetWebhooks(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printWebhooks(cmd, &apiv1.ListWebhooksResponse{Webhooks: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)

	var state string
	update := &cobra.Command{
		Use:   "update WEBHOOK [--url URL] [--types T,…] [--description D] [--state enabled|disabled]",
		Short: "Change an endpoint; --state enabled resumes one that was disabled",
		Args:  positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			req := &apiv1.UpdateWebhookRequest{Tenant: t, Webhook: argv[0]}
			fl := cmd.Flags()
			if fl.Changed("url") {
				req.Url = &url
			}
			if fl.Changed("types") {
				req.Types, req.UpdateTypes = types, true
			}
			if fl.Changed("description") {
				req.Description = &description
			}
			if fl.Changed("state") {
				req.State = &state
			}
			resp, err := c.Webhooks.Update(cmd.Context(), request(req, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printWebhooks(cmd, resp.Msg, resp.Msg.GetWebhook())
		},
	}
	addTenantFlag(update, &tenant)
	update.Flags().StringVar(&url, "url", "", "the new URL")
	update.Flags().StringSliceVar(&types, "types", nil, "replace the event types or globs (empty: every event)")
	update.Flags().StringVar(&description, "description", "", "the new description")
	update.Flags().StringVar(&state, "state", "", "enabled or disabled")
	addConfirmationFlag(update, &confirmationID)

	del := &cobra.Command{
		Use:   "delete WEBHOOK",
		Short: "Delete an endpoint and its deliveries",
		Args:  positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Webhooks.Delete(cmd.Context(), request(&apiv1.DeleteWebhookRequest{Tenant: t, Webhook: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	test := &cobra.Command{
		Use:   "test WEBHOOK",
		Short: "Queue a webhook.test event for this endpoint alone",
		Args:  positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Webhooks.Test(cmd.Context(), request(&apiv1.TestWebhookRequest{Tenant: t, Webhook: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printDeliveries(cmd, resp.Msg, resp.Msg.GetDelivery())
		},
	}
	addTenantFlag(test, &tenant)
	addConfirmationFlag(test, &confirmationID)

	var overlap time.Duration
	rotate := &cobra.Command{
		Use:   "rotate-secret WEBHOOK [--overlap 24h]",
		Short: "Make a new signing secret; the old one keeps signing for the overlap",
		Long: `Make a new signing secret and print it once. Until the overlap ends every
delivery carries two v1 signatures, one per secret, so receivers can switch
to the new secret at their own pace.`,
		Args: positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			if overlap < 0 {
				return invalidArg("overlap", "must not be negative")
			}
			resp, err := c.Webhooks.RotateSecret(cmd.Context(), request(&apiv1.RotateWebhookSecretRequest{Tenant: t, Webhook: argv[0],
				OverlapSeconds: int64(overlap / time.Second)}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				webhookTable(w, resp.Msg.GetWebhook())
				fmt.Fprintf(w, "\nsecret: %s  (shown once; store it now)\n", resp.Msg.GetSecret())
			})
		},
	}
	addTenantFlag(rotate, &tenant)
	rotate.Flags().DurationVar(&overlap, "overlap", 0, "how long the old secret keeps signing (default 24h, at most 168h)")
	addConfirmationFlag(rotate, &confirmationID)

	var deliveryState string
	deliveries := &cobra.Command{
		Use:   "deliveries WEBHOOK [--state pending|succeeded|dead]",
		Short: "List an endpoint's deliveries in order",
		Args:  positional("WEBHOOK"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.WebhookDelivery, string, error) {
				resp, err := c.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: t,
					Webhook: argv[0], State: deliveryState, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetDeliveries(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printDeliveries(cmd, &apiv1.ListWebhookDeliveriesResponse{Deliveries: all}, all...)
		},
	}
	addTenantFlag(deliveries, &tenant)
	deliveries.Flags().StringVar(&deliveryState, "state", "", "only deliveries in this state")
	addLimitFlag(deliveries, &limit)

	redeliver := &cobra.Command{
		Use:   "redeliver WEBHOOK DELIVERY",
		Short: "Send a dead (or delivered) delivery again",
		Args:  positional("WEBHOOK", "DELIVERY"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Webhooks.Redeliver(cmd.Context(), request(&apiv1.RedeliverWebhookRequest{Tenant: t, Webhook: argv[0],
				Delivery: argv[1]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printDeliveries(cmd, resp.Msg, resp.Msg.GetDelivery())
		},
	}
	addTenantFlag(redeliver, &tenant)
	addConfirmationFlag(redeliver, &confirmationID)

	cmd.AddCommand(create, list, get, update, del, test, rotate, deliveries, redeliver)
	return cmd
}

func webhookTable(w io.Writer, items ...*apiv1.Webhook) {
	row(w, "ID", "URL", "TYPES", "STATE", "UPDATED")
	for _, h := range items {
		types := strings.Join(h.GetTypes(), ",")
		if types == "" {
			types = "*"
		}
		st := h.GetState()
		if h.GetDisabledReason() != "" {
			st += " (" + h.GetDisabledReason() + ")"
		}
		row(w, h.GetId(), h.GetUrl(), types, st, ts(h.GetUpdateTime()))
	}
}

func (a *app) printWebhooks(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Webhook) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) { webhookTable(w, items...) })
}

func (a *app) printDeliveries(cmd *cobra.Command, msg proto.Message, items ...*apiv1.WebhookDelivery) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "EVENT", "TYPE", "STATE", "ATTEMPTS", "LAST", "NEXT")
		for _, d := range items {
			last := fmt.Sprint(d.GetLastStatus())
			if d.GetLastError() != "" {
				last = d.GetLastError()
			}
			if d.GetAttempts() == 0 {
				last = "-"
			}
			row(w, d.GetId(), d.GetEventId(), d.GetEventType(), d.GetState(), fmt.Sprint(d.GetAttempts()), last, ts(d.GetNextAttemptTime()))
		}
	})
}
