package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
)

// querier is what a transaction, a connection and the pool share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ querier = (*sql.DB)(nil)
	_ querier = (*sql.Tx)(nil)
	_ querier = (*sql.Conn)(nil)
)

// dbtx runs the store's queries, written with SQLite's placeholders (? and ?NNN), on q: for PostgreSQL
// they are rewritten to $N.
type dbtx struct {
	q  querier
	pg bool
}

func (t dbtx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.q.ExecContext(ctx, t.rebind(query), args...)
}

func (t dbtx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.q.QueryContext(ctx, t.rebind(query), args...)
}

func (t dbtx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.q.QueryRowContext(ctx, t.rebind(query), args...)
}

// rebind rewrites the placeholders of query for PostgreSQL: ?NNN to $NNN, and the n-th bare ? to $n. The
// store's queries have no ? inside string literals.
func (t dbtx) rebind(query string) string {
	if !t.pg || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c != '?' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('$')
		if i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9' {
			continue // ?NNN: the digits follow
		}
		n++
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// pool returns the store's queries on its connection pool, outside any transaction.
func (s *Store) pool() dbtx { return dbtx{s.db, s.pg != nil} }
