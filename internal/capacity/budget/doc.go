// Package budget owns the budgets table, the BudgetService API, pool prices
// and the spend check every booking makes: a tenant's bookings may commit
// at most a budget's amount per period at their pools' prices; a hard
// budget refuses what would pass it (SPEND_LIMIT_REACHED), a hard or soft
// one emits a budget.threshold event the first time a period's committed
// cost reaches each of its thresholds.
//
// What is committed is never stored: it is computed from the reservations
// table (price × quantity × booked hours within the period) when a booking
// is checked — inside the booking's transaction, with the budget row locked
// so concurrent bookings of one tenant serialize — or a budget is read.
// Money is integer micro-units of the platform's one currency, never a
// float. The package must never write reservations, place anything or
// decide access itself: every API call goes through the envelope.
package budget
