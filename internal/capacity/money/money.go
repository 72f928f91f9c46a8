// Package money reads and writes amounts of the platform's one currency as
// integer micro-units: prices (pool policy) and budgets are decimals on
// the API and never floats inside. It must never know what is priced.
package money

import (
	"fmt"
	"strconv"
	"strings"
)

// Micros is an amount in millionths of the platform's currency unit.
type Micros = int64

// MaxAmount bounds a budget or a price (in whole units) so that every sum
// of them stays far inside int64 micro-units.
const MaxAmount = 1_000_000_000

// ParseAmount reads a decimal string ("12", "0.5", "2.125") of at most 6
// decimals into micro-units; it refuses signs, exponents and more digits.
func ParseAmount(s string) (Micros, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 6 || strings.Contains(s, ".") && frac == "" {
		return 0, fmt.Errorf("must be a decimal with at most 6 decimals, got %q", trunc(s))
	}
	for _, part := range []string{whole, frac} {
		for _, r := range part {
			if r < '0' || r > '9' {
				return 0, fmt.Errorf("must be a decimal with at most 6 decimals, got %q", trunc(s))
			}
		}
	}
	if len(strings.TrimLeft(whole, "0")) > 10 {
		return 0, fmt.Errorf("must be at most %d, got %q", MaxAmount, trunc(s))
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("must be a decimal with at most 6 decimals, got %q", trunc(s))
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	if w > MaxAmount || w == MaxAmount && f > 0 {
		return 0, fmt.Errorf("must be at most %d, got %q", MaxAmount, trunc(s))
	}
	return w*1_000_000 + f, nil
}

// FormatAmount writes micro-units as a decimal with at least 2 decimals
// and at most 6 ("100.00", "0.0125", "-3.50").
func FormatAmount(m Micros) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", m%1_000_000), "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return fmt.Sprintf("%s%d.%s", sign, m/1_000_000, frac)
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
