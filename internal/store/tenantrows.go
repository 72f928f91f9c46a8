package store

// TenantRow is one row a tenant's delete removes: the table it sits in and
// its key (the id, or the columns that name it). Every module lists its own
// rows of a tenant as TenantRows, so the delete's dry run and the delete
// walk the same list.
type TenantRow struct {
	Table string
	ID    string
}

// TenantRows reads a two-column result (table, key), as Strings does for
// one column, and closes the rows.
func TenantRows(rows Rows, err error) ([]TenantRow, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TenantRow
	for rows.Next() {
		var r TenantRow
		if err := rows.Scan(&r.Table, &r.ID); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
