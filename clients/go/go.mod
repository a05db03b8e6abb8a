module github.com/reflex-ipc/reflex-ipc/clients/go

go 1.19
