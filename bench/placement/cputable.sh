#!/bin/bash
# Used by docs/benchmarks.md ("Arrays at the machine's limit"): CPU per create by where.
# cpu-table.sh BIN PROFILE CREATES: µs of CPU per create by where (pprof -focus totals)
bin=$1; prof=$2; n=$3
tot() { go tool pprof -top "$@" $bin $prof 2>/dev/null | sed -n 's/.*Showing nodes accounting for \([0-9.]*\)\(m\?s\), .* of \([0-9.]*\)s total.*/\1 \2/p' | awk '{v=$1; if ($2=="ms") v=v/1000; print v}'; }
all=$(go tool pprof -top $bin $prof 2>/dev/null | sed -n 's/.*Total samples = \([0-9.]*\)s.*/\1/p')
row() { label=$1; shift; s=$(tot "$@"); [ -z "$s" ] && s=0; printf "| %s | %.0f |\n" "$label" $(echo "$s*1000000/$n" | bc -l); }
printf "| total (all goroutines) | %.0f |\n" $(echo "$all*1000000/$n" | bc -l)
row "benchmark clients (Connect client, HTTP/2 client side)" -focus 'apiv1connect.\(\*reservationServiceClient\)' 
row "response compression (gzip)" -focus 'compress/'
row "directory version + cached tenant/project/pool/key reads" -focus 'dirversion|authn\.|tenancy\.' 
row "codec, interceptor, envelope (outside the placer)" -focus 'connect\.\(\*Handler\)|envelope\.\(\*Interceptor\)' -ignore 'placer\.|dirversion|authn\.|cedar'
row "Cedar decision" -focus 'cedar'
row "placement (snapshot, place, mark)" -focus 'placer\.\(\*Index\)\.Snapshot|placement\.Place$|placer\.\(\*Index\)\.mark|placer\.\(\*Index\)\.refreshed'
row "row writes (InsertRows)" -focus 'store\.InsertRows'
row "other statements in the placer transaction" -focus 'placer\.\(\*placer\)\.run' -ignore 'store\.InsertRows|sqlite\.\(\*tx\)\.Commit|placer\.\(\*Index\)\.Snapshot|placement\.Place$|placer\.\(\*Index\)\.mark|refreshed|Marshal|cedar' 
row "commit" -focus 'sqlite\.\(\*tx\)\.Commit|postgres\.\(\*tx\)\.Commit'
row "GC (background mark)" -focus 'gcBgMarkWorker'
