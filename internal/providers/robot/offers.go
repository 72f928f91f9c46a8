package robot

import (
	"context"
	"math/big"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/internal/providers"
)

// hoursPerMonth turns Robot's monthly price into an hourly one: Robot bills
// dedicated servers by the month and states no hourly price.
const hoursPerMonth = 730

type productPrice struct {
	Location string `json:"location"`
	Price    struct {
		Net         string `json:"net"`
		Gross       string `json:"gross"`
		HourlyNet   string `json:"hourly_net"`
		HourlyGross string `json:"hourly_gross"`
	} `json:"price"`
}

type product struct {
	Product struct {
		ID          string         `json:"id"`
		Description []string       `json:"description"`
		Prices      []productPrice `json:"prices"`
	} `json:"product"`
}

var (
	memoryRE = regexp.MustCompile(`(?i)^(\d+)\s*GB\b.*\b(DDR\d|RAM)`)
	diskRE   = regexp.MustCompile(`(?i)^(\d+)\s*x\s*(\d+(?:[.,]\d+)?)\s*(GB|TB)\b`)
	gpuRE    = regexp.MustCompile(`(?i)^(?:(\d+)\s*x\s*)?(NVIDIA\s.+)$`)
)

// Offers lists the server product catalog: one offer per product and
// location. Robot does not page it. An offer is what the account can
// order in Robot; Create claims only servers the account already rents.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	var products []product
	if err := p.call(ctx, http.MethodGet, "/order/server/product", nil, &products); err != nil {
		return nil, err
	}
	var out []providers.Offer
	for _, pr := range products {
		base := providers.Offer{ServerType: pr.Product.ID, Currency: "EUR", Available: true}
		describe(&base, pr.Product.Description)
		for _, price := range pr.Product.Prices {
			o := base
			o.Location = price.Location
			o.PriceMonthly = price.Price.Net
			o.PriceHourly = price.Price.HourlyNet
			if o.PriceHourly == "" {
				o.PriceHourly = hourly(price.Price.Net)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// describe reads memory, disk and GPUs from Robot's description lines
// ("64 GB DDR4", "2 x 1.92 TB NVMe SSD", "NVIDIA RTX 4000 SFF Ada
// Generation"); Robot states the CPU's model, not its thread count, so
// VCPU stays 0.
func describe(o *providers.Offer, lines []string) {
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if m := memoryRE.FindStringSubmatch(l); m != nil {
			gb, _ := strconv.Atoi(m[1])
			o.MemoryGiB = float64(gb)
		}
		if m := diskRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			size, _ := strconv.ParseFloat(strings.ReplaceAll(m[2], ",", "."), 64)
			if strings.EqualFold(m[3], "TB") {
				size *= 1000
			}
			o.DiskGiB += n * int(size)
		}
		if m := gpuRE.FindStringSubmatch(l); m != nil {
			n := 1
			if m[1] != "" {
				n, _ = strconv.Atoi(m[1])
			}
			o.GPUs += n
			o.GPUModel = m[2]
		}
	}
}

// hourly is monthly / hoursPerMonth to four places, exactly; "" for a
// price that is no decimal.
func hourly(monthly string) string {
	r, ok := new(big.Rat).SetString(monthly)
	if !ok {
		return ""
	}
	return r.Quo(r, big.NewRat(hoursPerMonth, 1)).FloatString(4)
}
