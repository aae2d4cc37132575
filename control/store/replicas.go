package store

import (
	"context"
	"fmt"
	"time"
)

// Replica is one gateway running on the store, as it last reported itself (control.Follower reports it).
type Replica struct {
	ID         string // host name and process id
	Address    string // where its control plane listens
	Version    string // its rolter version
	Generation int64  // the store generation its config serves
	Error      string // why it does not serve a newer generation ("" when none)
	Seen       time.Time
}

// replicaForget is how long a replica that stopped reporting stays listed.
const replicaForget = time.Hour

// ReportReplica records r, seen now, and forgets the replicas not seen for replicaForget. It is not a
// change of the store: the generation stays, and no audit row is written.
func (s *Store) ReportReplica(ctx context.Context, r Replica) error {
	if err := CheckName("replica id", r.ID, MaxNameLen); err != nil {
		return fmt.Errorf("cannot report replica %q: %w", r.ID, err)
	}
	now := s.now()
	q := s.pool()
	_, err := q.ExecContext(ctx, `INSERT INTO replicas (id, address, version, generation, error, seen) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET address = excluded.address, version = excluded.version,
		generation = excluded.generation, error = excluded.error, seen = excluded.seen`,
		r.ID, r.Address, r.Version, r.Generation, r.Error, now.UnixMilli())
	if err == nil {
		_, err = q.ExecContext(ctx, "DELETE FROM replicas WHERE seen < ?", now.Add(-replicaForget).UnixMilli())
	}
	if err != nil {
		return fmt.Errorf("cannot report replica %q: %w", r.ID, s.reach(err))
	}
	return nil
}

// Replicas returns the replicas that reported within replicaForget, sorted by id.
func (s *Store) Replicas(ctx context.Context) ([]Replica, error) {
	var out []Replica
	err := s.read(ctx, func(tx dbtx) error {
		rows, err := tx.QueryContext(ctx, "SELECT id, address, version, generation, error, seen FROM replicas WHERE seen >= ? ORDER BY id",
			s.now().Add(-replicaForget).UnixMilli())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r Replica
			var seen int64
			if err := rows.Scan(&r.ID, &r.Address, &r.Version, &r.Generation, &r.Error, &seen); err != nil {
				return err
			}
			r.Seen = millis(seen)
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list replicas: %w", err)
	}
	return out, nil
}
