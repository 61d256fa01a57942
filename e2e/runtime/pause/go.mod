module kimik3.io/e2e/pause

go 1.26
