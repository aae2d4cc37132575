package store

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/control/store/pgtest"
)

// The PostgreSQL tests run a real server (control/store/pgtest): make test requires it.

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// testPostgres returns the URL of a new database on the package's shared server.
func testPostgres(t testing.TB) string { return pgtest.Database(t) }

// onPostgres reports whether t runs under TestStorePostgres, whose subtests are the SQLite store tests
// run again on a PostgreSQL database (testStore opens one).
func onPostgres(t testing.TB) bool { return strings.HasPrefix(t.Name(), "TestStorePostgres/") }

// TestStorePostgres runs the store's tests again on PostgreSQL: one Store API, the same answers.
func TestStorePostgres(t *testing.T) {
	testPostgres(t) // skips here without a server
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"Orgs", TestStoreOrgs},
		{"Invalid", TestStoreInvalid},
		{"Providers", TestStoreProviders},
		{"Routes", TestStoreRoutes},
		{"KeysAndTokens", TestStoreKeysAndTokens},
		{"Cascade", TestStoreCascade},
		{"Audit", TestStoreAudit},
		{"Load", TestStoreLoad},
		{"LoadConsistent", TestStoreLoadConsistent},
		{"ConcurrentPut", TestStoreConcurrentPut},
		{"ConcurrentWriters", TestStoreConcurrentWriters},
		{"Replicas", TestStoreReplicas},
		{"Secrets", TestStoreSecrets},
		{"Limits", TestStoreLimits},
		{"LimitsCorrupt", TestStoreLimitsCorrupt},
		{"Usage", TestStoreUsage},
	} {
		t.Run(tc.name, tc.f)
	}
}

// TestStorePostgresSchema: the PostgreSQL migrations make SQLite's schema: the same tables with the same
// columns in the same order, the same NOT NULLs, and the same indexes.
func TestStorePostgresSchema(t *testing.T) {
	pg := openStore(t, testPostgres(t))
	lite := openStore(t, filepath.Join(t.TempDir(), "rolter.db"))
	query := func(s *Store, q string) []string {
		t.Helper()
		rows, err := s.db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var a, b string
			if err := rows.Scan(&a, &b); err != nil {
				t.Fatal(err)
			}
			out = append(out, a+" "+b)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		sort.Strings(out)
		return out
	}
	f := func(what string, got, want []string) {
		t.Helper()
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("PostgreSQL %s\n%q\nSQLite's\n%q", what, got, want)
		}
		t.Logf("%d %s alike", len(got), what)
	}
	// A SQLite PRIMARY KEY column is NOT NULL in effect (INTEGER) or by STRICT's rowid rules; PostgreSQL says so.
	f("columns", query(pg, `SELECT table_name || '.' || lpad(ordinal_position::text, 2, '0') || '.' || column_name,
		CASE WHEN is_nullable = 'NO' THEN 'not null' ELSE 'null' END
		FROM information_schema.columns WHERE table_schema = current_schema() AND table_name <> 'rolter_schema'`),
		query(lite, `SELECT m.name || '.' || printf('%02d', c.cid + 1) || '.' || c.name,
		CASE WHEN c."notnull" OR c.pk > 0 THEN 'not null' ELSE 'null' END
		FROM sqlite_schema m, pragma_table_info(m.name) c WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'`))
	f("indexes", query(pg, `SELECT tablename, indexname FROM pg_indexes WHERE schemaname = current_schema()
		AND indexname NOT LIKE '%\_pkey' AND indexname NOT LIKE '%\_key' AND tablename <> 'rolter_schema'`),
		query(lite, `SELECT tbl_name, name FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL`))
}
