module sandbox-operator.local/e2e/pause

go 1.22
