module reflex-ipc/clients/go

go 1.19
