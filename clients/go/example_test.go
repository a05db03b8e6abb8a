package reflex_test

import (
	"context"
	"fmt"
	"log"

	reflex "github.com/reflex-ipc/reflex-ipc/clients/go"
)

// The README's example (compiled, not run: it has no Output comment).
func ExampleSpawn() {
	ctx := context.Background()
	c, err := reflex.Spawn(ctx, reflex.Options{Command: "reflex", Args: []string{"stdio"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := c.Chat(ctx, []reflex.Message{{Role: "user", Content: "What is the capital of France?"}}, reflex.GenerateRequest{})
	if err != nil {
		log.Fatalf("%s: %v", reflex.Kind(err), err)
	}
	fmt.Println(r.Text, r.FinishReason)
	s, _ := c.Stream(ctx, reflex.GenerateRequest{Prompt: "Once upon a time", MaxTokens: 32})
	for s.Next() {
		if ev := s.Event(); ev.Event == "token" {
			fmt.Print(ev.Text)
		}
	}
	s.Close()
}
