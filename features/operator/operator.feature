@apiserver
Feature: The sandbox operator on a real API server
  As a plan execution engine on Kubernetes
  I want Sandboxes, Checkpoints and PlanCommits reconciled by the operator
  So that plan writes are isolated, restorable and committed all or nothing

  Background:
    Given a namespace on the local API server with the sandbox CRDs
    And the operator runs with the local executor

  Scenario: A Sandbox over a git repository becomes Active
    Given a git repository "repo" with file "f.txt" containing "base"
    When I apply a "git_worktree" Sandbox "s1" of plan "plan-a" over "repo"
    Then Sandbox "s1" becomes Active with Ready "True"
    And the sandbox path of "s1" holds file "f.txt" containing "base"

  Scenario: A PlanCommit commits every Sandbox of the plan
    Given a git repository "repo" with file "f.txt" containing "r0"
    And a directory "data" with file "g.txt" containing "d0"
    And an Active "git_worktree" Sandbox "sa" of plan "p1" over "repo" where "f.txt" is written as "r1"
    And an Active "copy_on_write" Sandbox "sb" of plan "p1" over "data" where "g.txt" is written as "d1"
    When I apply a PlanCommit "pc1" of plan "p1"
    Then PlanCommit "pc1" ends in phase "Committed" with condition "Committed" "True"
    And "repo" file "f.txt" contains "r1"
    And "data" file "g.txt" contains "d1"

  Scenario: A failing PlanCommit compensates and names the rolled-back sandbox
    Given a git repository "repo" with file "f.txt" containing "line1"
    And a directory "data" with file "g.txt" containing "d0"
    And an Active "copy_on_write" Sandbox "sa" of plan "p2" over "data" where "g.txt" is written as "d1"
    And an Active "git_worktree" Sandbox "sb" of plan "p2" over "repo" where "f.txt" is written as "sandbox"
    And "repo" file "f.txt" is committed on the original as "main"
    When I apply a Saga PlanCommit "pc2" of plan "p2"
    Then PlanCommit "pc2" ends in phase "Failed" with condition "Committed" "False"
    And the "Committed" condition of PlanCommit "pc2" names Sandbox "sb"
    And the rolled-back ids of PlanCommit "pc2" are the id of Sandbox "sa"
    And "data" file "g.txt" contains "d0"

  Scenario: A conflicting two-phase PlanCommit touches no original
    Given a git repository "repo" with file "f.txt" containing "line1"
    And a directory "data" with file "g.txt" containing "d0"
    And an Active "copy_on_write" Sandbox "sa" of plan "p4" over "data" where "g.txt" is written as "d1"
    And an Active "git_worktree" Sandbox "sb" of plan "p4" over "repo" where "f.txt" is written as "sandbox"
    And "repo" file "f.txt" is committed on the original as "main"
    When I apply a PlanCommit "pc4" of plan "p4"
    Then PlanCommit "pc4" ends in phase "Failed" with condition "Committed" "False"
    And the "Committed" condition of PlanCommit "pc4" names Sandbox "sb"
    And PlanCommit "pc4" rolled back nothing
    And "data" file "g.txt" contains "d0"

  Scenario: An operator killed in the middle of a PlanCommit ends all or nothing
    Given a git repository "repo" with file "f.txt" containing "r0"
    And a directory "data" with file "g.txt" containing "d0"
    And an Active "git_worktree" Sandbox "sa" of plan "p3" over "repo" where "f.txt" is written as "r1"
    And an Active "copy_on_write" Sandbox "sb" of plan "p3" over "data" where "g.txt" is written as "d1"
    And the operator will be killed right after the first sandbox commit is journaled
    When I apply a Saga PlanCommit "pc3" of plan "p3"
    And the operator dies and a new operator starts
    Then PlanCommit "pc3" ends in a terminal phase
    And either both originals hold the new content or neither does

  Scenario: Deleting a Sandbox removes its worktree and branch but not the original
    Given a git repository "repo" with file "f.txt" containing "base"
    And an Active "git_worktree" Sandbox "s1" of plan "p4" over "repo" where "new.txt" is written as "x"
    When I delete Sandbox "s1"
    Then Sandbox "s1" is gone
    And "repo" has only its main worktree and branch
    And "repo" file "f.txt" contains "base"

  Scenario: A Checkpoint restores a Sandbox on request
    Given a directory "data" with file "g.txt" containing "d0"
    And an Active "copy_on_write" Sandbox "s1" of plan "p5" over "data" where "g.txt" is written as "saved"
    When I apply a Checkpoint "c1" of Sandbox "s1"
    And Checkpoint "c1" becomes Ready
    And "g.txt" is written as "later" in Sandbox "s1"
    And I request restore "r1" of Sandbox "s1" to Checkpoint "c1"
    Then the sandbox path of "s1" holds file "g.txt" containing "saved"

  Scenario: A Sandbox with an unknown strategy is refused at apply
    When I apply a "bogus" Sandbox "bad" of plan "p6" over "nowhere"
    Then the API server refuses it with a message containing "Unsupported value"
